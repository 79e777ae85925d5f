"""Real Hugging Face and timm models through every check: a tiny transformers ViTForImageClassification
built from a ViTConfig (its output is an ImageClassifierOutput with .logits) and a timm model built
with pretrained=False (nothing is downloaded), each normalized the recommended way (normalize=)."""

from __future__ import annotations

import pytest
import torch
from test_model_interface import SIX

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")


def vit() -> torch.nn.Module:
    """A one-layer ViT on 8x8 RGB images (2 x 2 patches of 4 px), 4 classes, random weights."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32, num_labels=4)
    return transformers.ViTForImageClassification(config).eval()


def timm_model() -> torch.nn.Module:
    """timm's smallest ResNet ("test_resnet"), 4 classes, random weights."""
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False, num_classes=4).eval()


def images(n: int = 12):
    gen = torch.Generator().manual_seed(2)
    return torch.rand(n, 3, 8, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen)


#: Each family with its own normalization: the ViT image processor's 0.5 / 0.5, timm's pretrained_cfg.
FAMILIES = {
    "transformers-vit": (vit, lambda m: (0.5, 0.5)),
    "timm-test_resnet": (timm_model, lambda m: (m.pretrained_cfg["mean"], m.pretrained_cfg["std"])),
}


@pytest.mark.parametrize("check", list(SIX))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_check_runs_on_real_hugging_face_and_timm_models(family, check):
    build, normalization = FAMILIES[family]
    model = build()
    result = SIX[check](model, images(), normalize=normalization(model))
    assert 0.0 <= result.lower <= result.estimate <= result.upper <= (1.0 if result.direction == ">=" else 1e9)
    assert result.forward_passes > 0 and "normalized inside the model" in result.message()
    if "per_input" in result.details:
        assert (result.gallery is not None
                and len(result.gallery["index"]) == min(10, len(result.details["per_input"]["index"])))


def test_hugging_face_output_is_an_object_with_logits():
    out = vit()(images()[0])
    assert not isinstance(out, torch.Tensor) and isinstance(out.logits, torch.Tensor)
