"""Print what `.venv-unsloth` needs beside unsloth and unsloth_zoo, for `pip install -r`.

Run by `make venv-unsloth` with that environment's interpreter after `pip install --no-deps
unsloth unsloth_zoo` (2026.10.9; see the Makefile). pip's resolver cannot install them
with their own requirements here:
- both declare `certifi>=2026.10.19`, which the index does not have, so the resolver falls
  back to unsloth 2026.10.7, which has no CPU backend ("Unsloth cannot find any torch
  accelerator? You need a GPU."): the pin is dropped here and `constraints-unsloth.txt`
  holds certifi at the newest release there is;
- unsloth declares torchvision (and its extras torchaudio, torchcodec), which from the
  index bring a torch other than the CPU build installed first; text training needs none
  of them, so they are left out, as is torch itself (installed first, then constrained).
Then come the trainer's own imports from `art` (pydantic, safetensors, ...), which the child
process imports with `art` on its path (`art/runtime/trainer/unsloth_trainer.py`).
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

DISTRIBUTIONS = ("unsloth", "unsloth_zoo")
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "unsloth", "unsloth-zoo"}
UNPINNED = {"certifi"}
# What `art`'s trainer imports in the child (art's core and the PEFT trainer).
ART_TRAINER = ("pydantic", "openai", "httpx", "tqdm", "pyarrow", "safetensors", "peft")


def _name(requirement: Requirement) -> str:
    return requirement.name.lower().replace("_", "-")


def main() -> None:
    printed: set[str] = set()
    for distribution in DISTRIBUTIONS:
        for line in metadata.requires(distribution) or []:
            requirement = Requirement(line)
            if _name(requirement) in LEFT_OUT:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            requirement.marker = None
            if _name(requirement) in UNPINNED:
                requirement.specifier = SpecifierSet()
            if str(requirement) not in printed:
                printed.add(str(requirement))
                print(requirement)
    for name in ART_TRAINER:
        print(name)


if __name__ == "__main__":
    main()
