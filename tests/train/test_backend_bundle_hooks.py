"""What the backend takes from the bundle: where the trainable module lives
(``trainable_attr`` defaults to the bundle's) and the reshaping of a LoRA export
(``postprocess_lora_export`` runs after both formats are written)."""

from __future__ import annotations

from pathlib import Path

import torch
from train_fakes import TinyBundle, make_backend, tiny_transformer

from unirl.train.backend import bundle_trainable_attr


class ExpertsBundle:
    """Keeps its trained module under ``experts`` and says so (as Wan 2.2 does)."""

    trainable_attr = "experts"
    block_class_names = TinyBundle.block_class_names
    lora_default_targets = TinyBundle.lora_default_targets

    def __init__(self) -> None:
        self.experts = tiny_transformer()
        self.exported: list[tuple[Path, list[str]]] = []

    @property
    def trainable_module(self) -> torch.nn.Module:
        return self.experts

    def postprocess_lora_export(self, folder: Path) -> None:
        self.exported.append((folder, sorted(p.name for p in folder.iterdir())))


class NamedBundle(TinyBundle):
    """Declares its module by ``trainable_module_names`` only (as FlowMatchingBundle does)."""

    trainable_module_names = ("model",)

    def __init__(self) -> None:
        self.model = tiny_transformer()

    @property
    def trainable_module(self) -> torch.nn.Module:
        return self.model


def test_trainable_attr_defaults_to_the_bundles_and_an_explicit_value_wins() -> None:
    experts = ExpertsBundle()
    backend = make_backend(bundle=experts)
    assert backend.trainable_attr == "experts" and experts.experts is backend.module
    assert not hasattr(experts, "transformer")  # nothing written where the module is not
    named = NamedBundle()
    assert make_backend(bundle=named).trainable_attr == "model"
    assert make_backend(bundle=TinyBundle()).trainable_attr == "transformer"
    explicit = ExpertsBundle()
    backend = make_backend(bundle=explicit, trainable_attr="alias")
    assert backend.trainable_attr == "alias" and explicit.alias is backend.module  # type: ignore[attr-defined]
    assert [bundle_trainable_attr(b) for b in (experts, named, object())] == [
        "experts",
        "model",
        "transformer",
    ]


def test_export_runs_the_bundles_postprocess_after_both_formats(tmp_path: Path) -> None:
    bundle = ExpertsBundle()
    backend = make_backend(bundle=bundle)
    backend.export_lora(tmp_path / "lora")
    assert bundle.exported == [
        (
            tmp_path / "lora",
            [
                "adapter_config.json",
                "adapter_model.safetensors",
                "pytorch_lora_weights.safetensors",
            ],
        )
    ]
    make_backend(bundle=TinyBundle()).export_lora(tmp_path / "plain")  # no hook: as written
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == bundle.exported[0][1]
