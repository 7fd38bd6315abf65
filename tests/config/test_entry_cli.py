"""The entrypoint's command line: Hydra's flags in any position (through the real entrypoint,
in a subprocess), and how a multirun names each job's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from unirl.config.entry import (
    CommandLine,
    hydra_command_line,
    job_output_dir,
    split_command_line,
    swept_keys,
)

RECIPE = "--config-name=diffusion/sd3_tiny_trainside"
DEFAULTS = [
    "hydra.run.dir=.",
    "hydra.output_subdir=null",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "unirl.train_diffusion", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )


def test_flags_work_before_after_and_between_overrides() -> None:
    for args in (
        ("num_rollouts=3", "--cfg", "job"),
        ("--cfg", "job", "num_rollouts=3"),
        ("num_rollouts=3", "--cfg", "job", "batch_size=4", "--resolve"),
    ):
        out = _cli(RECIPE, *args)
        assert out.returncode == 0, f"{args}: {out.stderr[-2000:]}"
        assert "\nnum_rollouts: 3\n" in out.stdout, args
    assert "\nbatch_size: 4\n" in out.stdout and "${" not in out.stdout  # resolved


def test_bare_info_and_help_work() -> None:
    info = _cli(RECIPE, "--info")
    assert info.returncode == 0, info.stderr[-2000:]
    assert "Defaults List" in info.stdout and "hydra/job_logging/none" in info.stdout
    helped = _cli(RECIPE, "num_rollouts=5", "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "== Config ==" in helped.stdout and "\nnum_rollouts: 5\n" in helped.stdout


def test_hydra_sees_overrides_then_defaults_then_flags() -> None:
    line = split_command_line(["a=1", "--cfg", "job", "b=2", "-m", "--info", "config"])
    assert line == CommandLine(
        overrides=["a=1", "b=2"], flags=["--cfg", "job", "-m", "--info", "config"], multirun=True
    )
    assert hydra_command_line(line) == [
        "a=1",
        "b=2",
        *DEFAULTS,
        "--cfg",
        "job",
        "-m",
        "--info",
        "config",
    ]
    # a user's own Hydra setting wins over ours; a multirun's sweep folder is ours unless named
    own = CommandLine(
        overrides=["hydra.run.dir=/x", "hydra/job_logging=default"], flags=[], multirun=True
    )
    assert hydra_command_line(own, sweep_dir="/tmp/s") == [
        "hydra.run.dir=/x",
        "hydra/job_logging=default",
        "hydra.output_subdir=null",
        "hydra/hydra_logging=none",
        "hydra.sweep.dir='/tmp/s'",
    ]
    named = CommandLine(overrides=["hydra.sweep.dir=/mine"], flags=["-m"], multirun=True)
    assert "hydra.sweep.dir='/tmp/s'" not in hydra_command_line(named, sweep_dir="/tmp/s")
    # what Hydra's parser refuses, and --version, go to Hydra as given
    assert split_command_line(["--cfg", "nonsense"]) is None
    assert split_command_line(["--version"]) is None


def test_multirun_job_folders_are_named_by_number_and_swept_values() -> None:
    swept = swept_keys(["backend.optimizer.lr=1e-3,2e-3", "num_rollouts=2", "seed=range(0,2)"])
    assert swept == {"backend.optimizer.lr", "seed"}
    job = ["backend.optimizer.lr=0.002", "num_rollouts=2", "seed=1"]
    assert job_output_dir("out/run", 3, job, swept) == Path(
        "out/run/3_backend.optimizer.lr=0.002,seed=1"
    )
    assert job_output_dir("out/run", 0, ["num_rollouts=2"], set()) == Path("out/run/0")
    # a swept output_dir stays the parent; a value with a path in it stays one folder
    assert job_output_dir(
        "a", 1, ["output_dir=a", "data_source.path=/d/p.txt"], {"output_dir", "data_source.path"}
    ) == Path("a/1_data_source.path=_d_p.txt")


def test_a_failed_multirun_job_is_reported_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """Both jobs refused by the validators (before Ray): each says so, the sweep runs both,
    and the exit code says it failed."""
    out = _cli("-m", RECIPE, "batch_size=3,5", "stack.micro_batch_size=8", f"output_dir={tmp_path}")
    assert out.returncode == 1, out.stderr[-2000:]
    assert "[unirl] multirun job 0" in out.stdout and "[unirl] multirun job 1" in out.stdout
    assert out.stderr.count("[unirl] configuration error") == 2
    assert out.stderr.splitlines()[-2:] == [
        f"[unirl] multirun: job 0 ({tmp_path}/0_batch_size=3): exit code 2",
        f"[unirl] multirun: job 1 ({tmp_path}/1_batch_size=5): exit code 2",
    ]


def test_help_lists_every_key_with_a_line_from_its_typed_config() -> None:
    """``--help`` keeps Hydra's usage and adds ``== Keys ==``: the recipe's values (overrides
    applied), defaults of keys it leaves out marked ``+``, descriptions from the dataclasses."""
    out = _cli(RECIPE, "--help", "stack.micro_batch_size=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "== Config ==" in out.stdout and "== Keys ==" in out.stdout
    keys = out.stdout.split("== Keys ==", 1)[1].splitlines()

    def line(key: str) -> str:
        found = [x for x in keys if x[3:].startswith(f"{key} = ")]
        assert len(found) == 1, (key, found)
        return found[0]

    # a field of TrainStackConfig: its clause of the class docstring
    micro = line("stack.micro_batch_size")
    assert micro.startswith("   stack.micro_batch_size = 2 ")
    assert "[an integer >= 1]  micro_batch_size samples per forward + backward;" in micro
    # not in the recipe: default shown, marked +
    assert line("stack.shuffle").startswith("  +stack.shuffle = true ")
    # a field docstring (RunConfig.keep_last) and a nested _target_ block's summary
    assert "keep the newest keep_last complete ones" in line("keep_last")
    assert "The GRPO loss for flow-matching models." in line("algorithm._target_")
    assert "[one of 'replay', 'rollout', 'current']" in line("algorithm.old_logp_source")
    # a named component of the reward backend, and the nested config of a plain mapping
    assert line("reward.backend.components.brightness.target").startswith(
        "   reward.backend.components.brightness.target = 0.8 "
    )
    assert line("backend.fsdp.cpu_offload").startswith("  +backend.fsdp.cpu_offload = false")
    # top-level component blocks are listed by their keys, not as '+bundle = null'
    assert not [x for x in keys if x[3:].startswith("bundle = ")]
    # values are resolved (${unirl_root:}, ${seed}, ${oc.env:...}), as the run sees them
    assert not [x for x in keys if "${" in x.split("  [", 1)[0]]
    assert line("backend.seed").startswith("   backend.seed = 0 ")


def test_help_of_the_default_recipe_and_hydra_help_still_work() -> None:
    default = _cli("--help")
    assert default.returncode == 0, default.stderr[-2000:]
    assert "   bundle._target_ = unirl.models.sd3.SD3Bundle " in default.stdout
    hydra_help = _cli(RECIPE, "--hydra-help")
    assert hydra_help.returncode == 0, hydra_help.stderr[-2000:]
    assert "Hydra (" in hydra_help.stdout and "== Keys ==" not in hydra_help.stdout


def test_a_config_dir_recipe_named_like_a_bundled_one_is_refused(tmp_path: Path) -> None:
    """Hydra searches examples/ before --config-dir: a same-named recipe would be replaced by
    ours without a word. One line names both files and the fix; a new name composes."""
    from unirl.config.entry import EXAMPLES_DIR

    ours = EXAMPLES_DIR / "diffusion/sd3_tiny_trainside.yaml"
    (tmp_path / "diffusion").mkdir()
    theirs = tmp_path / "diffusion/sd3_tiny_trainside.yaml"
    text = ours.read_text().replace("num_rollouts: 40", "num_rollouts: 7")
    assert text != ours.read_text()
    theirs.write_text(text)
    out = _cli(f"--config-dir={tmp_path}", RECIPE, "--cfg", "job")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines() == [
        f"[unirl] configuration error: --config-dir recipe {theirs} has the same name as the "
        f"bundled {ours}, which Hydra would load instead (examples/ is searched first); rename "
        "yours (e.g. diffusion/sd3_tiny_trainside_mine.yaml) and pass "
        "--config-name=diffusion/sd3_tiny_trainside_mine"
    ]
    # the default recipe is checked too when no --config-name is given
    assert _cli("--config-dir", str(tmp_path), "--cfg", "job").returncode == 2
    theirs.rename(tmp_path / "diffusion/sd3_tiny_trainside_mine.yaml")
    renamed = _cli(
        f"--config-dir={tmp_path}",
        "--config-name=diffusion/sd3_tiny_trainside_mine",
        "--cfg",
        "job",
    )
    assert renamed.returncode == 0, renamed.stderr[-2000:]
    assert "\nnum_rollouts: 7\n" in renamed.stdout
    # --help lists the keys of a recipe found only in --config-dir
    helped = _cli(
        f"--config-dir={tmp_path}", "--config-name=diffusion/sd3_tiny_trainside_mine", "--help"
    )
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "   num_rollouts = 7 " in helped.stdout


def test_key_descriptions_come_from_field_docstrings_comments_then_class_docstrings() -> None:
    import dataclasses

    from unirl.config.help import field_docs

    @dataclasses.dataclass(kw_only=True)
    class Base:
        """Base knobs. ``inherited``: from the base's docstring; ``own`` is shadowed."""

        inherited: int = 1

    @dataclasses.dataclass(kw_only=True)
    class Knobs(Base):
        """Knobs of a thing. ``own`` is loses to the field docstring; ``mentioned``: the
        clause that names it (a parenthesis; with a semicolon) and no more; ``other`` x.
        ``plain=None``: written with a value."""

        own: int = 0
        """The field docstring wins."""
        trailing: int = 0  # the comment on the line
        # the comment lines
        # right above
        above: int = 0
        mentioned: int = 0
        plain: int | None = None
        silent: int = 0

    class Component:
        """A component: ``lr`` set by keyword."""

        config_class = Knobs

        def __init__(self, *, lr: float = 1.0) -> None:
            """``lr``: not read, the class docstring named it first."""

    docs = field_docs(Component)
    assert docs["own"] == "The field docstring wins."
    assert docs["trailing"] == "the comment on the line"
    assert docs["above"] == "the comment lines right above"
    assert (
        docs["mentioned"]
        == "mentioned: the clause that names it (a parenthesis; with a semicolon) and no more;"
    )
    assert docs["plain"] == "plain=None: written with a value."
    assert docs["inherited"] == "inherited: from the base's docstring;"
    assert docs["lr"] == "A component: lr set by keyword."
    assert "silent" not in docs


def _refusal(*args: str, entry: str = "unirl.train_diffusion") -> str | None:
    from unirl.config.entry import override_refusal, register_run_defaults

    register_run_defaults()
    line = split_command_line([RECIPE, *args])
    assert line is not None
    return override_refusal(line, "diffusion/sd3_tiny_trainside", entry)


def test_an_override_of_a_key_the_recipe_lacks_gets_one_line_with_the_fix() -> None:
    """Hydra's refusal is several lines and always suggests '+': the line names the missing
    key, the close matches or the keys that exist there, and the fix for each case."""
    help_cmd = "python -m unirl.train_vlm --config-name=diffusion/sd3_tiny_trainside --help"
    assert _refusal("num_rolouts=3", entry="unirl.train_vlm") == (
        "override 'num_rolouts=3': the recipe has no key 'num_rolouts' (did you mean "
        f"'num_rollouts' or 'rollout'?); {help_cmd} lists every key"
    )
    block = _refusal("trainer.max_steps=3")  # a block no recipe has: named, not its leaf
    assert block is not None
    assert block.startswith(
        "override 'trainer.max_steps=3': the recipe has no key 'trainer' (keys at the top "
        "level: ['advantage', 'algorithm', 'backend', "
    )
    assert _refusal("backend.optimizer.lrr=1") == (  # a typo: the fix is the key it meant
        "override 'backend.optimizer.lrr=1': the recipe has no key 'backend.optimizer.lrr' "
        "(did you mean 'lr'?); write 'backend.optimizer.lr=1'"
    )
    shuffle = _refusal("stack.shuffle=false")
    assert shuffle is not None
    assert "no key 'stack.shuffle' (keys under 'stack': ['_target_', 'max_grad_norm'," in shuffle
    assert "add it with '+stack.shuffle=...'" in shuffle
    new = "{_target_: unirl.reward.local.BrightnessTarget, target: 0.5}"
    assert _refusal(f"reward.backend={new}") == (
        f"override 'reward.backend={new}': the recipe has no key 'reward.backend.target' "
        "(keys under 'reward.backend': ['_target_', 'components', 'weights']); a mapping on "
        "the command line is merged into the recipe's 'reward.backend' block; to replace the "
        "block write '~reward.backend' '+reward.backend={...}'"
    )
    # what composes is not refused: existing keys, '+' for a default, '~' then '+', sweeps
    assert _refusal("num_rollouts=3", "+stack.shuffle=false") is None
    assert _refusal("~reward.backend", f"+reward.backend={new}") is None
    assert _refusal("-m", "stack.micro_batch_size=1,2") is None
    # a swept misspelling is left to Hydra's own report; the plain ones beside it are checked
    assert _refusal("-m", "num_rolouts=1,2") is None
    assert _refusal("-m", "num_rolouts=1,2", "seeed=1") is not None


def test_a_plus_key_typo_gets_a_did_you_mean() -> None:
    """``+stack.shufle=false`` composes (``+`` adds any key); the validator refuses it and
    names the key the class takes."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "unirl.train_diffusion",
            RECIPE,
            "+stack.shufle=false",
            "dry_run=true",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(root)},
        cwd="/",
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "stack: unknown key(s) ['shufle'] for unirl.train.TrainStack (did you mean "
        "'shufle' -> 'shuffle'?); accepted keys are " in out.stderr
    )


def test_the_refusal_exits_2_before_hydra_runs() -> None:
    out = _cli(RECIPE, "backend.optimizer.lrr=1", "--cfg", "job")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "[unirl] configuration error: override 'backend.optimizer.lrr=1': the recipe has no key"
    )


def test_the_troubleshooting_page_quotes_the_refusals_as_printed() -> None:
    from unirl.config.entry import EXAMPLES_DIR

    page = (EXAMPLES_DIR.parent / "docs" / "troubleshooting.md").read_text()
    new = "{_target_: unirl.reward.local.BrightnessTarget, target: 0.5}"
    for args in (("stack.shuffle=no",), (f"reward.backend={new}",)):
        line = _refusal(*args)
        assert line is not None and f"[unirl] configuration error: {line}\n" in page, args
