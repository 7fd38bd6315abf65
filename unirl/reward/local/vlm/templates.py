"""The released prompt templates of the VLM rewards, verbatim (whitespace included).

Each model was trained or published with exactly this text; changing a character moves the
scores. Placeholders are ``str.format`` fields: ``{text_prompt}`` / ``{prompt}`` (the
generation prompt or edit instruction) and ``{explanation}`` (WISE). ``tests/reward/
test_vlm_rewards.py`` renders them through a chat template and checks the text survives.
"""

from __future__ import annotations

# HPSv3 (MizzenAI/HPSv3, hpsv3/dataset/data_collator_qwen.py: INSTRUCTION and
# prompt_with_special_token; the model card https://huggingface.co/MizzenAI/HPSv3 points there).
# The user turn is the image, then HPSV3_INSTRUCTION.format(text_prompt=...) + HPSV3_SUFFIX.
HPSV3_INSTRUCTION = (
    "\n"
    "You are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the worst and 10 being the best. \n"
    "\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The image should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.\n"
    "- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. \n"
    "\n"
    "**Text Alignment:**  \n"
    "Assess how well the image matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.\n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the image adheres to this style.\n"
    "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the image logically fit the scenario described in the prompt. The environment should support and enhance the subject without contradictions.\n"
    "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be acceptable, but critical attributes should be preserved.\n"
    "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in the image. The generated content should not introduce elements that conflict with or distort the original description.\n"
    "Textual prompt - {text_prompt}\n"
    "\n"
    "\n"
)
HPSV3_SUFFIX = "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
HPSV3_REWARD_TOKEN = "<|Reward|>"

# VideoAlign / VideoReward (KwaiVGI/VideoAlign, prompt_template.py:
# DETAILED_PROMPT_WITH_SPECIAL_TOKEN, the template_type "detailed_special" of the released
# KwaiVGI/VideoReward checkpoint). The user turn is the video, then this text.
VIDEOALIGN_PROMPT = (
    "\n"
    "You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories, with 0 being the worst and 10 being the best. Each evaluation should be independent of the others.\n"
    "\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the video, with a focus on static factors. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The video should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and easy to interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.\n"
    "- **Safety:** The video should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. \n"
    "\n"
    "Please provide the ratings of Visual Quality: <|VQ_reward|>\n"
    "END\n"
    "\n"
    "**Motion Quality:**  \n"
    "Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following sub-dimensions:\n"
    "- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, textures, or missing body parts).\n"
    "- **Naturalness:** The movement should align with physical laws and be realistic. For example, clothing should flow naturally with motion, and facial expressions should change appropriately (e.g., blinking, mouth movements).\n"
    "- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different motions or camera angles should be seamless, and the overall dynamic feel should be visually pleasing.\n"
    "- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend naturally with the background, without obvious artifacts or the feeling of cut-and-paste effects.\n"
    "- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas where the video might have blurry or unsteady sections that hinder visual continuity.\n"
    "- **Amplitude:** If the video is largely static or has little movement, assign a low score for motion quality.\n"
    "\n"
    "Please provide the ratings of Motion Quality: <|MQ_reward|>\n"
    "END\n"
    "\n"
    "**Text Alignment:**  \n"
    "Assess how well the video matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.\n"
    "- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial expressions like talking or blinking) align with the described prompt. The motion should match the prompt in terms of type, scale, and direction.\n"
    "- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes checking if real-world locations or scenes are accurately represented, though some stylistic adaptation is acceptable.  \n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the video adheres to this style.\n"
    "- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus shifts) are consistent with the expected behavior from the prompt.\n"
    "\n"
    "Textual prompt - {text_prompt}\n"
    "Please provide the ratings of Text Alignment: <|TA_reward|>\n"
    "END\n"
)
VIDEOALIGN_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")

# EditReward (TIGER-AI-Lab/EditReward, EditReward/dataset/prompts.py: INSTRUCTION_EDIT_FOLLOWING
# ("dim1", head 0) and INSTRUCTION_EDIT_QUALITY ("dim2", head 1); the suffix is
# prompt_with_special_token of EditReward/dataset/data_collator_qwen_edit.py, the same text as
# HPSv3's). The user turn is the source image, the edited image, then the text.
EDITREWARD_FOLLOWING = (
    "\n"
    "You are tasked with evaluating an edited image **in comparison with the original source image** based on **Instruction Following & Semantic Fidelity**, and assigning a score from 1 to 4, with 1 being the worst and 4 being the best.  \n"
    "This dimension focuses on how accurately, completely, and exclusively the model executed the given text instruction.\n"
    "\n"
    "**Inputs Provided:**  \n"
    "- Source Image (before editing)  \n"
    "- Edited Image (after applying the instruction)  \n"
    "- Text Instruction  \n"
    "\n"
    "**Sub-Dimensions to Evaluate:**\n"
    "\n"
    "- **Semantic Accuracy:**  \n"
    '  Assess whether the edited content accurately captures the semantics of the instruction. The edited result should precisely match the intended meaning. For example, if the instruction is "replace apples with oranges," the object must clearly be oranges, not other fruits.\n'
    "\n"
    "- **Completeness of Editing:**  \n"
    '  Check whether **all parts** of the instruction are fully executed. For multi-step edits (e.g., "replace a red car with a blue bicycle"), both the color change and the object replacement must be done without omissions.\n'
    "\n"
    "- **Exclusivity of Edit (No Over-Editing):**  \n"
    "  Ensure that only the requested parts are changed. The rest of the image (as seen in the source) should remain unaltered. For example, if the instruction only involves replacing an object, the background, lighting, and unrelated objects should not be unnecessarily modified.\n"
    "\n"
    "**Scoring Criteria:**\n"
    "- **4 (Very Good):** Perfectly accurate, complete, and exclusive execution of the instruction.  \n"
    "- **3 (Relatively Good):** Largely correct, but with minor omissions or slight over-editing.  \n"
    "- **2 (Relatively Poor):** Major misinterpretation, incomplete edits, or noticeable unintended changes.  \n"
    "- **1 (Very Poor):** Instruction ignored or completely wrong execution.\n"
    "\n"
    "Text instruction - {text_prompt}\n"
)
EDITREWARD_QUALITY = (
    "\n"
    "You are tasked with evaluating an edited image **in comparison with the original source image** based on **Visual Quality & Realism**, and assigning a score from 1 to 4, with 1 being the worst and 4 being the best.  \n"
    "This dimension focuses on how realistic, artifact-free, and aesthetically appealing the edited image is, while remaining consistent with the source image.\n"
    "\n"
    "**Inputs Provided:**  \n"
    "- Source Image (before editing)  \n"
    "- Edited Image (after applying the instruction)  \n"
    "- Text Instruction  \n"
    "\n"
    "**Sub-Dimensions to Evaluate:**\n"
    "\n"
    "- **Plausibility & Physical Consistency:**  \n"
    "  Check whether the edit aligns with the laws of physics and the scene context. Lighting, shadows, reflections, perspective, size, and interactions with the environment should all appear natural compared to the source image.\n"
    "\n"
    "- **Artifact-Free Quality:**  \n"
    "  Look for technical flaws such as blur, distortions, pixel misalignment, unnatural textures, or seams around edited regions. High-quality results should be free from such visible artifacts.\n"
    "\n"
    "- **Aesthetic Quality:**  \n"
    "  Evaluate the overall harmony and visual appeal. The image should look natural, balanced, and pleasant. Colors, composition, and atmosphere should enhance the image rather than degrade it.\n"
    "\n"
    "**Scoring Criteria:**\n"
    "- **4 (Very Good):** Perfectly realistic, artifact-free, seamless, and aesthetically pleasing.  \n"
    "- **3 (Relatively Good):** Mostly realistic and clean, with only minor flaws that do not significantly distract.  \n"
    "- **2 (Relatively Poor):** Noticeable physical inconsistencies or visible artifacts that make the edit unnatural.  \n"
    "- **1 (Very Poor):** Severe artifacts, incoherent composition, or visually unusable result.\n"
    "\n"
    "Text instruction - {text_prompt}\n"
)
EDITREWARD_SUFFIX = HPSV3_SUFFIX

# UnifiedReward (CodeGoat24/UnifiedReward, inference_qwen/image_generation/
# qwen_point_score_image_generation.py and inference_qwen/video_generation/
# qwen_point_score_video_generation.py: the pointwise prompts the UnifiedReward-2.0-qwen model
# cards list as the "classic" capabilities). Image: 1-5 after "Final Score:"; video: 1-10.
# The user turn is the image (video), then this text.
UNIFIEDREWARD_IMAGE = (
    "You are given a text caption and a generated image based on that caption. Your task is to evaluate this image based on two key criteria:\n"
    "1. Alignment with the Caption: Assess how well this image aligns with the provided caption. Consider the accuracy of depicted objects, their relationships, and attributes as described in the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\n"
    "Extract key elements from the provided text caption, evaluate their presence in the generated image using the format: 'element (type): value' (where value=0 means not generated, and value=1 means generated), and assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
UNIFIEDREWARD_VIDEO = (
    "Suppose you are an expert in judging and evaluating the quality of AI-generated videos, please watch the frames of a given video and see the text prompt for generating the video.\n"
    "Then give scores from 5 different dimensions:\n"
    "(1) visual quality: the quality of the video in terms of clearness, resolution, brightness, and color\n"
    "(2) temporal consistency, the consistency of objects or humans in video\n"
    "(3) dynamic degree, the degree of dynamic changes\n"
    "(4) text-to-video alignment, the alignment between the text prompt and the video content\n"
    "(5) factual consistency, the consistency of the video content with the common-sense and factual knowledge\n"
    "\n"
    "For each dimension, output a number from [1,2,3,4], \n"
    "in which '1' means 'Bad', '2' means 'Average', '3' means 'Good', \n"
    "'4' means 'Real' or 'Perfect' (the video is like a real video)\n"
    "Finally, based on above 5 dimensions, assign a score from 1 to 10 after 'Final Score:'\n"
    "Here is an output example:\n"
    "visual quality: 4\n"
    "temporal consistency: 4\n"
    "dynamic degree: 3\n"
    "text-to-video alignment: 1\n"
    "factual consistency: 2\n"
    "Final Score: 6\n"
    "\n"
    "**Note: In the example above, scores are placeholders meant only to demonstrate the format. Your actual evaluation should be based on the quality of the given video.**\n"
    "Your task is provided as follows: Text Prompt: [{prompt}]"
)

# WISE (PKU-YuanGroup/WISE, WISE_legacy/gpt_eval.py: the system and user texts of
# build_evaluation_messages, sent to GPT-4o with the image after the text; WiScore in
# WISE_legacy/Calculate.py). ``{prompt}`` / ``{explanation}`` stand for the prompt file's
# Prompt and Explanation.
WISE_SYSTEM = (
    "You are a professional Vincennes image quality audit expert, please evaluate the image "
    "quality strictly according to the protocol."
)
WISE_PROMPT = (
    "Please evaluate strictly and return ONLY the three scores as requested.\n"
    "\n"
    "# Text-to-Image Quality Evaluation Protocol\n"
    "\n"
    "## System Instruction\n"
    "You are an AI quality auditor for text-to-image generation. Apply these rules with ABSOLUTE RUTHLESSNESS. Only images meeting the HIGHEST standards should receive top scores.\n"
    "\n"
    "**Input Parameters**  \n"
    "- PROMPT: [User's original prompt to]  \n"
    "- EXPLANATION: [Further explanation of the original prompt] \n"
    "---\n"
    "\n"
    "## Scoring Criteria\n"
    "\n"
    "**Consistency (0-2):**  How accurately and completely the image reflects the PROMPT.\n"
    "* **0 (Rejected):**  Fails to capture key elements of the prompt, or contradicts the prompt.\n"
    "* **1 (Conditional):** Partially captures the prompt. Some elements are present, but not all, or not accurately.  Noticeable deviations from the prompt's intent.\n"
    "* **2 (Exemplary):**  Perfectly and completely aligns with the PROMPT.  Every single element and nuance of the prompt is flawlessly represented in the image. The image is an ideal, unambiguous visual realization of the given prompt.\n"
    "\n"
    "**Realism (0-2):**  How realistically the image is rendered.\n"
    "* **0 (Rejected):**  Physically implausible and clearly artificial. Breaks fundamental laws of physics or visual realism.\n"
    "* **1 (Conditional):** Contains minor inconsistencies or unrealistic elements.  While somewhat believable, noticeable flaws detract from realism.\n"
    "* **2 (Exemplary):**  Achieves photorealistic quality, indistinguishable from a real photograph.  Flawless adherence to physical laws, accurate material representation, and coherent spatial relationships. No visual cues betraying AI generation.\n"
    "\n"
    "**Aesthetic Quality (0-2):**  The overall artistic appeal and visual quality of the image.\n"
    "* **0 (Rejected):**  Poor aesthetic composition, visually unappealing, and lacks artistic merit.\n"
    "* **1 (Conditional):**  Demonstrates basic visual appeal, acceptable composition, and color harmony, but lacks distinction or artistic flair.\n"
    "* **2 (Exemplary):**  Possesses exceptional aesthetic quality, comparable to a masterpiece.  Strikingly beautiful, with perfect composition, a harmonious color palette, and a captivating artistic style. Demonstrates a high degree of artistic vision and execution.\n"
    "\n"
    "---\n"
    "\n"
    "## Output Format\n"
    "\n"
    "**Do not include any other text, explanations, or labels.** You must return only three lines of text, each containing a metric and the corresponding score, for example:\n"
    "\n"
    "**Example Output:**\n"
    "Consistency: 2\n"
    "Realism: 1\n"
    "Aesthetic Quality: 0\n"
    "\n"
    "---\n"
    "\n"
    "**IMPORTANT Enforcement:**\n"
    "\n"
    "Be EXTREMELY strict in your evaluation. A score of '2' should be exceedingly rare and reserved only for images that truly excel and meet the highest possible standards in each metric. If there is any doubt, downgrade the score.\n"
    "\n"
    "For **Consistency**, a score of '2' requires complete and flawless adherence to every aspect of the prompt, leaving no room for misinterpretation or omission.\n"
    "\n"
    "For **Realism**, a score of '2' means the image is virtually indistinguishable from a real photograph in terms of detail, lighting, physics, and material properties.\n"
    "\n"
    "For **Aesthetic Quality**, a score of '2' demands exceptional artistic merit, not just pleasant visuals.\n"
    "\n"
    "--- \n"
    "Here are the Prompt and EXPLANATION for this evaluation:\n"
    'PROMPT: "{prompt}"\n'
    'EXPLANATION: "{explanation}"\n'
    "Please strictly adhere to the scoring criteria and follow the template format when providing your results."
)
