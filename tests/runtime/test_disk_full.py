"""A checkpoint save that fills the disk names the disk and loses nothing.

The disk is real: a 4 MiB tmpfs mounted under the test's directory, filled until the
adapter fits but its optimizer state does not. Its tensors are larger than a file
object's buffer, as a real model's are, so torch's own writer would fail mid-file as it
did in the incidents (`RuntimeError: ... unexpected pos`) were it given the file. Mounting needs root; where
it cannot be done the test is skipped with the reason. A file left open on the disk
(holding its space) fails the test when the disk is unmounted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import art
from art.core.store.atomic import replace_dir_atomic
from art.core.store.model_store import ModelStore
from art.runtime.trainer.peft_trainer import PeftTrainer, add_adapter

PAGE = 4096  # tmpfs stores whole pages


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        unmounted = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if unmounted.returncode != 0:  # a file on it is still open: detach it anyway
            subprocess.run(["umount", "--lazy", str(mount)], check=True)
            pytest.fail(f"a file on the full disk was left open: {unmounted.stderr.strip()}")


def tiny_trainer() -> PeftTrainer:
    """A PEFT trainer of a random 2-layer Llama whose optimizer has taken one step."""
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=256,  # LoRA tensors of 16-32 KiB, past the file buffer's 8 KiB
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = add_adapter(LlamaForCausalLM(config), "policy", art.dev.PeftArgs(r=16), seed=0)
    trainer = PeftTrainer(
        model,
        None,  # type: ignore[arg-type]  # saving never tokenizes
        init_args=art.dev.InitArgs(),
        trainer_args=art.dev.TrainerArgs(),
    )
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    trainer.optimizer.step()  # AdamW's moments: what makes optimizer.pt as big as it is
    return trainer


def pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


@pytest.mark.parametrize("fits", ["half the adapter", "the adapter and half the optimizer"])
def test_a_full_disk_names_the_path_and_space_and_keeps_the_checkpoint(
    small_disk: Path, fits: str
) -> None:
    trainer = tiny_trainer()
    store = ModelStore(small_disk, "project", "agent")
    replace_dir_atomic(store.checkpoint_dir(1), trainer.save)
    first = {path.name: path.read_bytes() for path in store.checkpoint_dir(1).iterdir()}
    assert store.step() == 1

    adapter = len(first["adapter_model.safetensors"])
    if fits == "half the adapter":
        room = pages(adapter // 2)
    else:
        room = sum(pages(len(data)) for name, data in first.items() if name != "optimizer.pt")
        room += pages(len(first["optimizer.pt"]) // 2)
    filler = small_disk / "filler"
    filler.write_bytes(bytes(shutil.disk_usage(small_disk).free - room))

    with pytest.raises(art.StorageError) as raised:
        replace_dir_atomic(store.checkpoint_dir(2), trainer.save)
    error = raised.value
    assert isinstance(error.__cause__, OSError)
    free = shutil.disk_usage(small_disk).free
    message = str(error)
    assert str(store.checkpoint_dir(2)) in message
    assert "No space left on device" in message
    assert f"has {free:,} bytes free" in message
    assert error.free_bytes == free
    assert error.needed_bytes == sum(len(data) for data in first.values())
    assert f"about {error.needed_bytes:,} bytes" in message
    assert str(store.checkpoint_dir(1)) in message  # where the estimate comes from
    # No partial checkpoint; the previous one and the step count as they were.
    assert sorted(path.name for path in store.checkpoints_dir.iterdir()) == ["0001"]
    assert {p.name: p.read_bytes() for p in store.checkpoint_dir(1).iterdir()} == first
    assert store.step() == 1

    filler.unlink()
    replace_dir_atomic(store.checkpoint_dir(2), trainer.save)
    assert store.step() == 2
    assert {p.name: p.read_bytes() for p in store.checkpoint_dir(2).iterdir()} == first
