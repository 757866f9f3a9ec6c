"""ResNet (He et al. 2015, "Deep Residual Learning for Image Recognition"), written from the
paper's description: ResNet-50 is the 50-layer network of its Table 1, and ``tiny`` the same
design, narrower and shallower, on 64 x 64 images: the smallest size at which one sample per
replica trains (on 32 x 32 the last stage is 1 x 1, and batch normalisation over one value per
channel raises "Expected more than 1 value per channel when training"; at 64, 2 x 2).

- Stem (conv1): a 7 x 7 convolution of 64 channels with stride 2, then 3 x 3 max pooling with
  stride 2.
- Four stages (conv2_x to conv5_x) of bottleneck blocks (section 4.1, Fig. 5 right): 1 x 1
  convolution down to the stage's width, 3 x 3 at that width, 1 x 1 up to 4 x the width; batch
  normalisation after every convolution (section 3.4), ReLU after each normalisation but the
  last, which is added to the shortcut first. Widths 64, 128, 256, 512; ResNet-50 has 3, 4, 6
  and 3 blocks.
- Each stage after the first halves the resolution in its first block. Here that stride sits on
  the 3 x 3 convolution (the "v1.5" placement that torchvision and most later training use; the
  paper strides the first 1 x 1), which changes no parameter.
- Shortcuts are identities, or where the shape changes a 1 x 1 projection with batch
  normalisation (the paper's option B, section 3.3).
- Global average pooling and one fully connected layer to the classes.

ResNet-50 with 1000 classes has 25,557,032 parameters (tested). Where ``torchvision`` imports
(GPU machines), ``resnet:50`` is its ``resnet50(weights=None)``, the same network. FSDP units and
activation checkpointing: the bottleneck blocks. No tensor-parallel plan: the convolutions have
no Megatron split here."""

from __future__ import annotations

import functools
import importlib

import torch
import torch.nn.functional as F
from torch import nn

from parallel_kernels.workload import Workload
from parallel_kernels.zoo import ZOO, sized

EXPANSION = 4  # a bottleneck's output channels over its width (Fig. 5 right: 64 -> 256)


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    # no bias: the batch normalisation right after has its own shift
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return [conv, nn.BatchNorm2d(c_out)]


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = EXPANSION * width
        self.residual = nn.Sequential(
            *_conv_bn(c_in, width, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, c_out, 1),
        )
        same = stride == 1 and c_in == c_out
        self.shortcut = nn.Identity() if same else nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.residual(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(
        self,
        blocks: tuple[int, ...] = (3, 4, 6, 3),
        widths: tuple[int, ...] = (64, 128, 256, 512),
        classes: int = 1000,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            *_conv_bn(3, widths[0], 7, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages, c_in = [], widths[0]
        for i, (n, width) in enumerate(zip(blocks, widths, strict=True)):
            stride = 1 if i == 0 else 2  # conv2_x follows the max pooling at the same size
            stage = []
            for j in range(n):
                stage.append(Bottleneck(c_in, width, stride if j == 0 else 1))
                c_in = EXPANSION * width
            stages.append(nn.Sequential(*stage))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                # He et al. 2015 ("Delving Deep into Rectifiers"): variance 2 / fan for ReLU
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50() -> ResNet:
    return ResNet()


def _images(n: int, seed: int, *, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    # Labels from a fixed random linear teacher over a 4 x 4 pooling of the image: a fact of
    # the image that the network can learn, so the loss can really fall.
    teacher = torch.randn(3 * 16, classes, generator=torch.Generator().manual_seed(0))
    return x, (F.adaptive_avg_pool2d(x, 4).flatten(1) @ teacher).argmax(dim=1)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _torchvision_resnet50() -> tuple[type[nn.Module], type[nn.Module]] | None:
    """torchvision's ResNet-50 builder and its bottleneck class, where torchvision loads: its
    wheel on the CPU machines is the CUDA build, whose import fails (RuntimeError: operator
    torchvision::nms does not exist), so any failure means "build our own"."""
    try:
        module = importlib.import_module("torchvision.models.resnet")
    except Exception:  # noqa: BLE001  (ImportError, or RuntimeError from a mismatched build)
        return None
    return module.resnet50, module.Bottleneck


def _workload(size: str, description: str, build, unit, *, image: int, classes: int) -> Workload:
    return Workload(
        name=f"resnet:{size}",
        description=description,
        build=build,
        batch=functools.partial(_images, size=image, classes=classes),
        loss=_loss,
        fsdp_units=(unit,),
    )


def tiny() -> Workload:
    return _workload(
        "tiny",
        "ResNet at test size: bottlenecks 1-1-1-1, widths 16-128, 64 x 64 images, 10 classes",
        functools.partial(ResNet, (1, 1, 1, 1), (16, 32, 64, 128), 10),
        Bottleneck,
        image=64,
        classes=10,
    )


def fifty() -> Workload:
    build, unit = _torchvision_resnet50() or (resnet50, Bottleneck)
    return _workload(
        "50",
        "ResNet-50 (25.6 M params), 224 x 224 images, 1000 classes",
        build,
        unit,
        image=224,
        classes=1000,
    )


ZOO["resnet"] = sized("resnet", {"tiny": tiny, "50": fifty})
