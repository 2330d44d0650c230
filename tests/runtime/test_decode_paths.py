"""The decode loop's fast paths give the answers of the plain ones.

- `sampling.sample` draws from the distribution it is given (temperature, top_p, masks),
  never a zero-probability token, and repeats itself under a seed.
- The engine's KV cache (`kv_cache.GrowingLayer`) and one-token attention
  (`decode_attention`) give the same tokens and logprobs as the trainer's full-sequence
  forward pass (stock SDPA, no cache), rows of different lengths batched together.
- The merged sampling copy (`merged.MergedCopy`) serves the adapter's current weights:
  its logprobs equal the PEFT-wrapped model's, and again after the adapter changes; its
  decode steps run through `lean_decode.LeanDecoder`, which gives transformers' own logits
  for each architecture it takes. It holds only what merges write: the rest are the
  wrapped model's tensors, and its own map of the weights file is gone.
fp32 throughout, so the comparisons can be tight.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import tiny_causal_lm

from art.core.data import dev
from art.core.data.dev import PeftArgs
from art.runtime import models
from art.runtime.engines.base import SamplingParams
from art.runtime.engines.transformers import kv_cache, lean_decode, packed, sampling
from art.runtime.engines.transformers.engine import TransformersEngine
from art.runtime.engines.transformers.lean_decode import LeanDecoder
from art.runtime.engines.transformers.merged import MergedCopy, plain_model, share_unmerged
from art.runtime.engines.transformers.prefix_cache import PrefixCache
from art.runtime.trainer.peft_trainer import add_adapter

pytestmark = pytest.mark.model  # loads the default model or starts a model service

DRAWS = 40_000


def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / len(tokens)


def _assert_distribution(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    seen = _frequencies(tokens, len(probs))
    # Five standard deviations of a binomial frequency, per token (the draws are seeded,
    # so the test is deterministic; the bound says how far off a bias would have to be).
    bound = 5 * (probs * (1 - probs) / len(tokens)).sqrt() + 1e-9
    assert bool(((seen - probs).abs() <= bound).all()), (seen, probs)


def test_samples_follow_the_distribution_and_skip_masked_tokens() -> None:
    torch.manual_seed(0)
    vocab = 700  # spans three sampling blocks, the last one partly padding
    logits = torch.randn(vocab) * 0.5  # every unmasked token drawn ~57 times
    logits[[3, 256, 511, 699]] = float("-inf")  # masked, e.g. by a grammar
    rows = logits.expand(DRAWS, vocab).contiguous()
    tokens = sampling.sample(rows, [1.0] * DRAWS, [1.0] * DRAWS, [None] * DRAWS)
    probs = torch.softmax(logits.double(), -1)
    assert not bool(torch.isin(tokens, torch.tensor([3, 256, 511, 699])).any())
    _assert_distribution(tokens, probs)


def test_temperature_and_top_p_reshape_the_distribution() -> None:
    torch.manual_seed(1)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    rows = logits.expand(DRAWS, 5).contiguous()
    cooled = sampling.sample(rows, [0.5] * DRAWS, [1.0] * DRAWS, [None] * DRAWS)
    _assert_distribution(cooled, torch.softmax(logits.double() / 0.5, -1))
    # top_p 0.8 keeps the smallest set reaching 0.8: here the first three tokens.
    probs = torch.softmax(logits.double(), -1)
    assert probs[:2].sum() < 0.8 <= probs[:3].sum()
    nucleus = sampling.sample(rows, [1.0] * DRAWS, [0.8] * DRAWS, [None] * DRAWS)
    kept = torch.cat([probs[:3] / probs[:3].sum(), torch.zeros(2, dtype=torch.float64)])
    _assert_distribution(nucleus, kept)
    greedy = sampling.sample(rows[:10], [0.0] * 10, [1.0] * 10, [None] * 10)
    assert greedy.tolist() == [0] * 10


def test_a_seed_repeats_its_tokens_and_logprobs_use_the_model_distribution() -> None:
    logits = torch.randn(6, 1000)
    first = sampling.sample(logits, [1.0] * 6, [1.0] * 6, [torch.Generator().manual_seed(7)] * 6)
    again = sampling.sample(logits, [1.0] * 6, [1.0] * 6, [torch.Generator().manual_seed(7)] * 6)
    assert first.tolist() == again.tolist()
    expected = torch.log_softmax(logits, -1)
    assert torch.allclose(logits - sampling.normalizers(logits)[:, None], expected, atol=1e-5)
    # Drawn at temperature 1 from the logits themselves, the draw's own sums normalize; at
    # another temperature, or from masked logits, the model's distribution is still used.
    masked = logits.clone()
    masked[:, 500:] = float("-inf")
    for temperature, drawn_from, unmasked in (
        (1.0, logits, None),
        (0.5, logits, None),
        (1.0, masked, logits),
    ):
        generators = [torch.Generator().manual_seed(7)] * 6
        tokens, normalizers = sampling.sample_with_normalizers(
            drawn_from, [temperature] * 6, [1.0] * 6, generators, unmasked=unmasked
        )
        assert torch.allclose(logits - normalizers[:, None], expected, atol=1e-5)
        generators = [torch.Generator().manual_seed(7)] * 6
        assert (
            tokens.tolist()
            == sampling.sample(drawn_from, [temperature] * 6, [1.0] * 6, generators).tolist()
        )
    assert int(tokens.max()) < 500


def test_a_kept_weights_buffer_draws_as_a_fresh_one_and_is_written_in_place() -> None:
    """A decode loop's draws write their weights into one buffer kept between steps (a
    fresh vocabulary-wide tensor a step was a new mapping faulted in on a CPU): the same
    tokens and normalizers as without it, as rows leave and join, over a vocabulary that is
    not whole blocks (the buffer's zero tail is never drawn nor summed)."""
    torch.manual_seed(2)
    vocab = 700
    buffer = sampling.WeightsBuffer()
    storage: list[int] = []
    for rows in (6, 3, 6, 8, 2):
        logits = torch.randn(rows, vocab) * 3
        logits[0, :-1] = float("-inf")  # all of row 0's mass on the vocabulary's last token
        # Every other step all rows draw at temperature 1 (the draw's sums normalize).
        natural = rows in (3, 8)
        temperatures = [1.0] * rows if natural else [1.0, 0.7, 1.0, 1.3, 1.0, 0.9][:rows]
        top_ps = [1.0] * rows if natural else [1.0, 1.0, 0.9, 1.0, 1.0, 1.0][:rows]
        drawn = []
        for kept in (buffer, None):
            generators = [torch.Generator().manual_seed(row) for row in range(rows)]
            drawn.append(
                sampling.sample_with_normalizers(
                    logits, temperatures, top_ps, generators, buffer=kept
                )
            )
        (tokens, normalizers), (fresh_tokens, fresh_normalizers) = drawn
        assert torch.equal(tokens, fresh_tokens), rows
        assert torch.equal(normalizers, fresh_normalizers), rows
        assert torch.allclose(normalizers, torch.logsumexp(logits, -1), atol=1e-5), rows
        assert int(tokens[0]) == vocab - 1
        storage.append(buffer.rows_for(logits).data_ptr())
    # Made at 6 rows, kept at 3 and 6, made again at 8 and kept at 2: 768 columns each row.
    assert storage[0] == storage[1] == storage[2] != storage[3] == storage[4]
    assert buffer.nbytes == 8 * 768 * 4
    buffer.release()
    assert buffer.nbytes == 0


def _engine(model: Any, tokenizer: Any, merged: MergedCopy | None = None) -> TransformersEngine:
    return TransformersEngine(
        model,
        tokenizer,
        max_num_seqs=16,
        stop_token_ids=set(),
        merged=merged,
    )


def _prompts(tokenizer: Any) -> list[list[int]]:
    questions = ["Hi.", "What is 12 + 30? Answer briefly.", "Write one line about the sea at dawn."]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for q in questions
    ]


def _full_forward_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The trainer's view: one forward pass over prompt + completion, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    predicting = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return predicting.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def _sample_all(
    engine: TransformersEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    adapter: str | None,
) -> list[Any]:
    async def run() -> list[Any]:
        results = await asyncio.gather(
            *(engine.generate(p, params, n=2, adapter=adapter) for p in prompts)
        )
        return [sample for samples in results for sample in samples]

    return asyncio.run(run())


def test_cache_and_decode_attention_match_the_full_forward_pass(
    default_model: tuple[Any, Any],
) -> None:
    model, tokenizer = default_model
    assert model.config._attn_implementation == "art_decode"
    engine = _engine(model, tokenizer)
    try:
        prompts = _prompts(tokenizer)
        for params in (
            SamplingParams(max_tokens=24, temperature=0),
            SamplingParams(max_tokens=24, temperature=1.0, seed=3),
        ):
            samples = _sample_all(engine, prompts, params, adapter=None)
            for prompt, sample in zip([p for p in prompts for _ in range(2)], samples, strict=True):
                full = _full_forward_logprobs(model, prompt, sample.token_ids)
                assert torch.allclose(full, torch.tensor(sample.logprobs), atol=1e-4), (
                    (full - torch.tensor(sample.logprobs)).abs().max()
                )
                if params.temperature == 0:  # greedy: every token the full pass's argmax
                    with torch.no_grad():
                        logits = model(torch.tensor([prompt + sample.token_ids])).logits[0]
                    argmax = logits[len(prompt) - 1 : -1].argmax(-1)
                    assert argmax.tolist() == sample.token_ids
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("packing", "targets"),
    [
        (None, None),
        ("onednn", None),
        ("onednn", ("q_proj", "v_proj", "up_proj")),
        ("mkl", ("q_proj", "v_proj", "up_proj")),
    ],
    ids=["plain", "packed", "packed-some-of-a-group", "packed-mkl-some-of-a-group"],
)
def test_the_merged_copy_serves_the_adapters_current_weights(
    default_model: tuple[Any, Any], packing: Any, targets: tuple[str, ...] | None
) -> None:
    """Packed: the copy's layers hold weights packed ahead (`packed.py`: blocked for oneDNN,
    or packed for MKL's packed GEMM), each merge packs W0 + delta afresh into the
    `PackedWeight`s the lean step holds; a layer's q/k/v and gate/up are packed as one
    weight each, so where the adapter takes only some of a group, the rest of it is
    packed again from W0."""
    if packing == "mkl" and not models.mkl_packed_linear_available():
        pytest.skip("this torch has no MKL packed linear")
    base, tokenizer = default_model
    peft_args = PeftArgs() if targets is None else PeftArgs(target_modules=targets)
    wrapped = add_adapter(copy.deepcopy(base), "policy", peft_args, seed=0)
    wrapped.set_adapter("policy")
    plain = copy.deepcopy(base).requires_grad_(False)
    share_unmerged(plain, plain_model(wrapped))  # as the engine's copy: embeddings shared
    if packing is not None:
        packed.pack(plain, packing)
    engine = _engine(wrapped, tokenizer, MergedCopy(wrapped, plain))
    lean = engine._decoder.lean
    assert isinstance(lean, LeanDecoder)  # the default model's decode steps skip transformers
    assert lean.packing == packing
    prompts = _prompts(tokenizer)[1:2]
    greedy = SamplingParams(max_tokens=16, temperature=0)
    try:
        for round_ in range(2):
            # A change to the adapter, as a training step makes, under the engine's pause.
            with engine.paused(), torch.no_grad():
                for name, parameter in wrapped.named_parameters():
                    if "lora_B" in name:
                        parameter.normal_(0, 0.02, generator=torch.Generator().manual_seed(round_))
            sample = _sample_all(engine, prompts, greedy, adapter="policy")[0]
            # Under the pause: the engine's batch may still be leaving its adapter selection
            # on the wrapped model when the answer arrives.
            with engine.paused():
                full = _full_forward_logprobs(wrapped, prompts[0], sample.token_ids)
                with wrapped.disable_adapter():
                    unadapted = _full_forward_logprobs(wrapped, prompts[0], sample.token_ids)
            assert torch.allclose(full, torch.tensor(sample.logprobs), atol=1e-4)
            assert (unadapted - full).abs().max() > 1e-2  # the adapter did act
        base_sample = _sample_all(engine, prompts, greedy, adapter=None)[0]
        with engine.paused(), wrapped.disable_adapter():
            full = _full_forward_logprobs(wrapped, prompts[0], base_sample.token_ids)
        assert torch.allclose(full, torch.tensor(base_sample.logprobs), atol=1e-4)
    finally:
        engine.close()


def test_the_merged_copy_holds_only_the_weights_merges_write(
    default_model: tuple[Any, Any],
) -> None:
    """A copy loaded from the weights file, as the engine's is: after `share_unmerged` its
    embeddings, LM head (still tied) and norms are the wrapped model's own tensors, each
    linear layer's weight has memory of its own, and the copy's map of the file is gone."""
    import gc

    base, _ = default_model
    wrapped = add_adapter(copy.deepcopy(base), "policy", PeftArgs(), seed=0)
    weights = str(models.resolve(models.DEFAULT_MODEL).weights)

    def maps_of_the_file() -> int:
        with open("/proc/self/maps") as maps:
            return sum(weights in line for line in maps)

    before = maps_of_the_file()
    plain, _ = models.load(models.resolve(models.DEFAULT_MODEL), "float32")
    plain.requires_grad_(False)
    assert maps_of_the_file() > before  # the test sees the map it expects to go
    theirs = plain_model(wrapped)
    share_unmerged(plain, theirs)
    gc.collect()
    assert maps_of_the_file() == before
    assert plain.model.embed_tokens.weight is theirs.model.embed_tokens.weight
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    assert plain.model.norm.weight is theirs.model.norm.weight
    layer, their_layer = plain.model.layers[3], theirs.model.layers[3]
    assert layer.input_layernorm.weight is their_layer.input_layernorm.weight
    mine = layer.mlp.down_proj.weight
    assert mine.data_ptr() != their_layer.mlp.down_proj.base_layer.weight.data_ptr()
    assert torch.equal(mine, their_layer.mlp.down_proj.base_layer.weight)


def test_merged_copy_rows_of_different_lengths_match_the_full_forward_pass(
    default_model: tuple[Any, Any],
) -> None:
    """Rows joined mid-flight with left padding, sampled at temperature 1, through the
    merged copy's lean decode steps: each token's logprob is the full pass's."""
    base, tokenizer = default_model
    wrapped = add_adapter(copy.deepcopy(base), "policy", PeftArgs(), seed=0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02, generator=torch.Generator().manual_seed(7))
    engine = _engine(wrapped, tokenizer, MergedCopy(wrapped, copy.deepcopy(base)))
    try:
        prompts = _prompts(tokenizer)
        params = SamplingParams(max_tokens=20, temperature=1.0, seed=5)
        samples = _sample_all(engine, prompts, params, adapter="policy")
        for prompt, sample in zip([p for p in prompts for _ in range(2)], samples, strict=True):
            full = _full_forward_logprobs(wrapped, prompt, sample.token_ids)
            got = torch.tensor(sample.logprobs)
            assert torch.allclose(full, got, atol=1e-4), (full - got).abs().max()
    finally:
        engine.close()


@pytest.mark.parametrize("lean", [False, True], ids=["transformers-step", "lean-step"])
def test_rows_leaving_mid_batch_leave_their_neighbours_answers_unchanged(
    default_model: tuple[Any, Any], lean: bool
) -> None:
    """Requests of different lengths in one batch: as each row finishes, a row from the
    end of the batch takes its place in the cache (`batch.compacted`), and every row's
    greedy tokens and logprobs are still the full pass's, through transformers' decode
    step and through the merged copy's lean one."""
    base, tokenizer = default_model
    merged = MergedCopy(base, copy.deepcopy(base).requires_grad_(False)) if lean else None
    engine = _engine(base, tokenizer, merged)
    assert (engine._decoder.lean is not None) == lean
    prompts = _prompts(tokenizer)
    lengths = [3, 17, 6, 24, 9, 13]

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(
                engine.generate(
                    prompts[i % len(prompts)],
                    SamplingParams(max_tokens=length, temperature=0),
                    n=1,
                    adapter=None,
                )
                for i, length in enumerate(lengths)
            )
        )

    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    for i, (samples, length) in enumerate(zip(results, lengths, strict=True)):
        prompt, tokens = prompts[i % len(prompts)], samples[0].token_ids
        assert len(tokens) == length
        full = _full_forward_logprobs(base, prompt, tokens)
        assert torch.allclose(full, torch.tensor(samples[0].logprobs), atol=1e-4)
        with torch.no_grad():
            logits = base(torch.tensor([prompt + tokens])).logits[0]
        assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == tokens


@pytest.mark.parametrize("lean", [False, True], ids=["transformers-step", "lean-step"])
def test_shared_prompt_prefixes_are_prefilled_once_and_change_nothing(
    default_model: tuple[Any, Any], lean: bool
) -> None:
    """Prompts sharing the chat template's system prompt, and a next turn extending an
    earlier prompt, take those positions from the prefix cache; every sampled token's
    logprob is still the full pass's, and the cache is emptied when the weights change.
    Through the merged copy's lean steps, prefill takes its logits through the lean
    decoder's head and a prefix computed for the cache takes none: the copy's LM head
    module never runs."""
    model, tokenizer = default_model
    merged = MergedCopy(model, copy.deepcopy(model).requires_grad_(False)) if lean else None
    engine = _engine(model, tokenizer, merged)
    assert (engine._decoder.lean is not None) == lean
    head_calls: list[int] = []
    if merged is not None:
        head = merged.plain.get_output_embeddings()
        head.register_forward_hook(lambda _m, args, _out: head_calls.append(args[0].shape[-2]))
    try:
        first = _prompts(tokenizer)
        params = SamplingParams(max_tokens=12, temperature=1.0)  # unseeded: seeded skip the cache
        samples = _sample_all(engine, first, params, adapter=None)
        after_first = engine._prefixes.saved
        assert after_first > 0  # the three prompts share the template's opening
        turn = first[1] + samples[2].token_ids + _prompts(tokenizer)[0][-8:]
        later = [turn, first[2]]  # an extended conversation, and a prompt seen before
        more = _sample_all(engine, later, params, adapter=None)
        # Both extend the cached opening: only their later tokens were computed.
        opening = next(i for i, ids in enumerate(zip(*first, strict=False)) if len(set(ids)) > 1)
        assert opening >= 16
        assert engine._prefixes.saved >= after_first + 2 * opening
        for prompt, sample in zip(
            [p for p in first + later for _ in range(2)], samples + more, strict=True
        ):
            full = _full_forward_logprobs(model, prompt, sample.token_ids)
            got = torch.tensor(sample.logprobs)
            assert torch.allclose(full, got, atol=1e-4), (full - got).abs().max()
        assert head_calls == []
        with engine.paused():
            pass
        assert engine._prefixes.longest(None, tuple(first[0])) is None
    finally:
        engine.close()


def test_a_prompt_seen_before_takes_one_prefill_call_and_its_prefix_is_kept(
    default_model: tuple[Any, Any],
) -> None:
    """A prompt that comes back alone (a retried rollout, the next turn of a loop over a few
    prompts) shares its whole prefix with its own earlier self only, so computing that
    prefix in a call of its own saves nothing now: it runs in one model call from the
    cached template opening, its prefix is kept from that call, and the next time it is
    taken from the cache. Every logprob is still the full pass's."""
    model, tokenizer = default_model
    engine = _engine(model, tokenizer)
    calls: list[int] = []  # tokens per call of the engine's (with a cache) to the model

    def count(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if "past_key_values" in kwargs:
            calls.append(kwargs["input_ids"].shape[1])

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        first = _prompts(tokenizer)
        again = first[2] + first[2][-18:]  # a prompt longer than the opening by 16+ tokens
        # Unseeded (seeded requests skip the cache); one token, so no decode step follows
        # the prefill and every call counted is a prefill call.
        params = SamplingParams(max_tokens=1, temperature=1.0)
        _sample_all(engine, [*first, again], params, adapter=None)
        opening = engine._prefixes.longest(None, tuple(again))
        assert opening is not None
        assert opening[0] < len(again) - 1  # the template's opening only
        for time in range(2):
            calls.clear()
            saved = engine._prefixes.saved
            [sample, _] = _sample_all(engine, [again], params, adapter=None)
            assert len(calls) == 1, (time, calls)
            kept = engine._prefixes.longest(None, tuple(again))
            assert kept is not None
            assert kept[0] == len(again) - 1, (time, kept[0])
            taken = engine._prefixes.saved - saved
            assert taken == (opening[0] if time == 0 else len(again) - 1), (time, taken)
            full = _full_forward_logprobs(model, again, sample.token_ids)
            got = torch.tensor(sample.logprobs)
            assert torch.allclose(full, got, atol=1e-4), (full - got).abs().max()
    finally:
        hook.remove()
        engine.close()


@pytest.mark.parametrize("prompt", [9, 1100], ids=["short", "long"])
@pytest.mark.parametrize("attention", ["fused", "matmul"])
@pytest.mark.parametrize("gemm", ["onednn", "blas", "packed", "packed-mkl"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_lean_decode_steps_give_transformers_logits(
    model_type: str, gemm: str, attention: Any, prompt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In float32 (the tiny model's dtype) through either library a decode step's
    matmuls can go to (`ART_DECODE_GEMM`), or on weights packed ahead, blocked for oneDNN
    (`packed`) or packed for MKL's packed GEMM (`packed-mkl`; prefill runs the packed
    modules too), with either attention (a CPU's fused kernel, a GPU's two matmuls: CI
    has no GPU, so its attention is held here), over a few positions and over more than
    the fused kernel takes in one block of keys. Each logit is transformers' own on the
    plain weights."""
    if gemm == "packed-mkl" and not models.mkl_packed_linear_available():
        pytest.skip("this torch has no MKL packed linear")
    named = {"packed": "onednn", "packed-mkl": "mkl"}.get(gemm, gemm)
    monkeypatch.setenv("ART_DECODE_GEMM", named)
    reference = tiny_causal_lm(model_type, max_positions=2048)
    model = reference
    if gemm.startswith("packed"):
        model = copy.deepcopy(reference)
        assert lean_decode.packs(model) == named  # named: never timed
        assert packed.pack(model, named) == 2 * 7  # every projection of both layers, not the head
    lean = LeanDecoder.of(model, attention=attention)
    assert lean is not None
    assert lean.attention == attention
    assert lean.packed == gemm.startswith("packed")
    assert lean.packing == (named if gemm.startswith("packed") else None)
    assert (lean.linear is torch.nn.functional.linear) == (gemm == "blas")
    # Two rows, the second left-padded by 3; both prefilled by transformers, then 4 steps.
    ids = torch.randint(1, 300, (2, prompt), generator=torch.Generator().manual_seed(1))
    attention = torch.ones(2, prompt, dtype=torch.long)
    attention[1, :3] = 0
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = kv_cache.new_cache()
    sequences = [ids[0].tolist(), ids[1, 3:].tolist()]
    with torch.inference_mode():
        model(
            input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache
        )
        next_position = positions[:, -1:] + 1
        for step in range(4):
            tokens = torch.tensor([11 + step, 200 - step])
            attention = torch.cat([attention, attention.new_ones(2, 1)], dim=1)
            logits = lean.step(tokens, next_position, attention, cache)
            next_position = next_position + 1
            for row, sequence in enumerate(sequences):
                sequence.append(int(tokens[row]))
                full = reference(torch.tensor([sequence])).logits[0, -1].float()
                assert torch.allclose(logits[row], full, atol=1e-4), (
                    (logits[row] - full).abs().max()
                )


def test_a_cpu_decodes_with_the_fused_attention_and_an_unknown_attention_is_refused() -> None:
    model = tiny_causal_lm("llama")
    lean = LeanDecoder.of(model)
    assert lean is not None
    assert lean.attention == "fused"
    with pytest.raises(ValueError, match="attention='flash'"):
        LeanDecoder.of(model, attention="flash")  # type: ignore[arg-type]


@pytest.mark.skipif(not models.onednn_linear_available(), reason="this torch has no oneDNN linear")
def test_a_row_split_gives_the_fewest_rows_to_blas_and_the_rest_to_onednn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each side of the split is its library's own result, bit for bit, and both agree.
    Unless `ART_DECODE_GEMM` names a library, the decoder times both on its weights and
    splits only at the fewest rows (BLAS won at 1-2 rows on an Intel Xeon, nowhere on an
    AMD EPYC): whichever it picks here, the logits tests above hold it to transformers."""
    weight = torch.randn(96, 64)
    bias = torch.randn(96)
    split = lean_decode._RowSplitLinear(2)
    for rows in (1, 2, 3, 5):
        x = torch.randn(rows, 64)
        got = split(x, weight, bias)
        blas = torch.nn.functional.linear(x, weight, bias)
        onednn = lean_decode._onednn_linear(x, weight, bias)
        assert torch.equal(got, blas if rows <= 2 else onednn), rows
        assert torch.allclose(blas, onednn, atol=1e-5)

    monkeypatch.delenv("ART_DECODE_GEMM", raising=False)
    chosen = lean_decode.linear_for(torch.float32, [weight, weight.T.contiguous()])
    if models.cpu_kernels().decode_gemm == "onednn":
        assert chosen is lean_decode._onednn_linear or (
            isinstance(chosen, lean_decode._RowSplitLinear) and chosen.blas_rows in (1, 2)
        )
    monkeypatch.setenv("ART_DECODE_GEMM", "onednn")  # named: never timed, never split
    assert lean_decode.linear_for(torch.float32, [weight]) is lean_decode._onednn_linear
    # The setting is float32's; bfloat16 steps take their own linear whatever it says.
    assert lean_decode.linear_for(torch.bfloat16, [weight]) is lean_decode._bf16_linear


@pytest.mark.skipif(not models.onednn_linear_available(), reason="this torch has no oneDNN linear")
def test_the_engines_copy_is_packed_where_every_row_count_goes_to_onednn(
    default_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_merged_copy` blocks the copy's layers for oneDNN exactly where the lean step would
    multiply every row count through it: a float32 CPU copy, oneDNN chosen (here named,
    so no timing decides), not where BLAS is named, not in bfloat16, not for an
    architecture the lean step does not reproduce. The packed copy's memory is counted."""
    from art.runtime.engines.transformers.engine import _bytes

    base, tokenizer = default_model
    served = add_adapter(copy.deepcopy(base), "policy", PeftArgs(), seed=0)

    def copy_for(dtype: str) -> Any:
        return _engines_copy(served, tokenizer, dtype).plain

    monkeypatch.setenv("ART_DECODE_GEMM", "onednn")
    plain = copy_for("float32")
    layer = plain.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, packed.PackedLinear)
    assert isinstance(layer.mlp.down_proj, packed.PackedLinear)
    assert type(plain.lm_head) is torch.nn.Linear  # the embeddings' tensor, still tied
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    linears = sum(p.numel() for n, p in base.named_parameters() if "layers." in n and "proj" in n)
    assert packed.packed_bytes(plain) == 4 * linears
    assert _bytes(plain) > 4 * linears
    assert not lean_decode.packs(plain)  # already packed: nothing more to do

    assert layer.self_attn.q_proj.blocked.packing == "onednn"

    monkeypatch.setenv("ART_DECODE_GEMM", "blas")
    assert type(copy_for("float32").model.layers[0].self_attn.q_proj) is torch.nn.Linear
    if models.mkl_packed_linear_available():
        monkeypatch.setenv("ART_DECODE_GEMM", "mkl")
        mkl_layer = copy_for("float32").model.layers[0]
        assert mkl_layer.self_attn.q_proj.blocked.packing == "mkl"
        assert mkl_layer.mlp.down_proj.blocked.packing == "mkl"
    # Unnamed: timed, and either packing (or none, where BLAS takes the fewest rows).
    monkeypatch.delenv("ART_DECODE_GEMM")
    timed = lean_decode.packs(copy.deepcopy(base).float())
    assert timed in (None, *packed.PACKINGS)
    assert lean_decode.packs(copy.deepcopy(base).float()) == timed  # once a process
    monkeypatch.setenv("ART_DECODE_GEMM", "onednn")
    assert not lean_decode.packs(copy.deepcopy(base).to(torch.bfloat16))
    assert not lean_decode.packs(tiny_causal_lm("gpt2"))


@pytest.mark.skipif(not models.onednn_linear_available(), reason="this torch has no oneDNN linear")
def test_a_packed_weight_refuses_to_be_copied() -> None:
    """A packed weight cannot be copied (torch cannot copy oneDNN's opaque tensor; MKL's
    layout follows its buffer's address): copying one, or a model holding one, is refused
    by name rather than failing inside torch or multiplying wrongly."""
    weight = torch.randn(24, 16)
    packings = ["onednn"] + (["mkl"] if models.mkl_packed_linear_available() else [])
    for packing in packings:
        with pytest.raises(TypeError, match=f"packed for {packing} cannot be copied"):
            copy.deepcopy(packed.block(weight, packing))
    model = torch.nn.Sequential(packed.PackedLinear(torch.nn.Linear(16, 24)))
    with pytest.raises(TypeError, match="copy the plain model and pack the copy"):
        copy.deepcopy(model)


def _engines_copy(served: Any, tokenizer: Any, dtype: str) -> MergedCopy:
    """The merged copy the engine would keep for `served` in `dtype` (`_merged_copy`)."""
    from art.runtime.engines.base import EngineSpec
    from art.runtime.engines.transformers.engine import _merged_copy

    config = dev.InternalModelConfig(
        init_args=dev.InitArgs(dtype=dtype), engine_args=dev.EngineArgs(merge_lora=True)
    )
    resolved = models.resolve(models.DEFAULT_MODEL)
    spec = EngineSpec(resolved, config, tokenizer, dtype, 2048, frozenset(), Path("."), 0, 1)
    merged = _merged_copy(served, spec)
    assert merged is not None
    return merged


def test_a_packed_copys_lm_head_is_blocked_while_decoding_and_dropped_at_a_pause(
    default_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LM head of a packed copy is the embedding table, so its blocked form is a second
    copy: made once enough steps of 8 rows or more have run to pay for it (a short run of
    one row never does), counted in the engine's memory, dropped at a pause (where
    training runs), made again after it; the tokens and logprobs are the full pass's."""
    base, tokenizer = default_model
    served = add_adapter(copy.deepcopy(base), "policy", PeftArgs(), seed=0)
    monkeypatch.setenv("ART_DECODE_GEMM", "onednn")
    merged = _engines_copy(served, tokenizer, "float32")
    engine = _engine(served, tokenizer, merged)
    lean = engine._decoder.lean
    assert isinstance(lean, lean_decode.LeanDecoder)
    assert lean.packed
    head_bytes = merged.plain.lm_head.weight.nbytes
    weights = engine.memory_bytes()
    prompt = _prompts(tokenizer)[1]

    def generate(rows: int, tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=tokens, temperature=0)
        samples = asyncio.run(engine.generate(prompt, params, n=rows, adapter="policy"))
        full = _full_forward_logprobs(served, prompt, samples[0].token_ids)
        for sample in samples:  # greedy: every row the same, and the full pass's
            assert sample.token_ids == samples[0].token_ids
            assert torch.allclose(full, torch.tensor(sample.logprobs), atol=1e-4)
        return samples[0].token_ids

    try:
        generate(1, 2 * lean_decode._HEAD_BLOCKED_AFTER)
        assert lean.held_bytes == 0  # one row at a time: blocking would not pay
        answers = []
        for _ in range(2):
            answers.append(generate(lean_decode._HEAD_WIDE_ROWS, 24))
            assert lean.held_bytes == head_bytes  # blocked for the run's last steps
            assert engine.memory_bytes() == weights + head_bytes
            with engine.paused():
                assert lean.held_bytes == 0
            assert engine.memory_bytes() == weights
        assert answers[0] == answers[1]
    finally:
        engine.close()


# The default model's matmuls of a decode step: fused q/k/v, o, gate/up, down, the LM head.
DEFAULT_MODEL_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


def test_a_bf16_row_through_the_matrix_vector_product_is_the_same_bits() -> None:
    """One bf16 row goes to `torch.mv` (the faster kernel where torch sends a 1-row matmul
    to oneDNN); it must give exactly `F.linear`'s result, or a single request would sample
    from other logits than a batch. A bias, or more rows, keep `F.linear`."""
    generator = torch.Generator().manual_seed(0)
    linear = lean_decode.linear_for(torch.bfloat16)
    assert linear is lean_decode._bf16_linear
    for out_features, in_features in DEFAULT_MODEL_SHAPES:
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).bfloat16()
        bias = torch.randn(out_features, generator=generator).bfloat16()
        for rows in (1, 2, 5):
            x = torch.randn(rows, in_features, generator=generator).bfloat16()
            expected = torch.nn.functional.linear(x, weight)
            assert torch.equal(linear(x, weight), expected), (out_features, in_features, rows)
            with_bias = torch.nn.functional.linear(x, weight, bias)
            assert torch.equal(linear(x, weight, bias), with_bias), (out_features, rows)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_bf16_lean_step_of_one_row_is_the_step_f_linear_takes(model_type: str) -> None:
    """The whole step, bit for bit, with and without the matrix-vector path."""
    model = tiny_causal_lm(model_type).to(torch.bfloat16)
    steps = {}
    for name in ("mv", "linear"):
        lean = LeanDecoder.of(model)
        assert lean is not None
        assert lean.linear is lean_decode._bf16_linear
        if name == "linear":
            lean.linear = torch.nn.functional.linear
        cache = kv_cache.new_cache()
        ids = torch.randint(1, 300, (1, 7), generator=torch.Generator().manual_seed(2))
        attention = torch.ones(1, 7, dtype=torch.long)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=attention, past_key_values=cache)
            logits = []
            for step in range(3):
                attention = torch.cat([attention, attention.new_ones(1, 1)], dim=1)
                position = torch.tensor([[7 + step]])
                logits.append(lean.step(torch.tensor([11 + step]), position, attention, cache))
        steps[name] = torch.stack(logits)
    assert torch.equal(steps["mv"], steps["linear"])


@pytest.mark.parametrize("gemm", ["onednn", "blas"])
def test_a_lean_step_reads_weights_written_in_place(
    gemm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge writes the copy's weights in place: the next step multiplies by the new
    values (no library keeps a converted copy of the old ones)."""
    monkeypatch.setenv("ART_DECODE_GEMM", gemm)
    model = tiny_causal_lm("llama")
    lean = LeanDecoder.of(model)
    assert lean is not None
    ids = torch.tensor([[5, 17, 42, 7, 99]])

    def step_against_the_full_pass() -> float:
        with torch.inference_mode():
            cache = kv_cache.new_cache()
            model(input_ids=ids, past_key_values=cache)
            tokens = torch.tensor([3])
            logits = lean.step(
                tokens, torch.tensor([[5]]), torch.ones(1, 6, dtype=torch.long), cache
            )
            full = model(torch.cat([ids, tokens[None]], dim=1)).logits[0, -1].float()
        return float((logits[0] - full).abs().max())

    assert step_against_the_full_pass() < 1e-4
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5)
    assert step_against_the_full_pass() < 1e-4


def test_lean_decode_shares_the_models_weights() -> None:
    """The fused projections are the model's own weights: a write to one (as a merge
    makes) changes both the transformers model and the lean step."""
    model = tiny_causal_lm("llama")
    lean = LeanDecoder.of(model)
    assert lean is not None
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        q_proj.add_(1.0)
    qkv = lean.layers[0].qkv
    assert isinstance(qkv, torch.Tensor)  # plain weights: one fused buffer
    assert torch.equal(qkv[: q_proj.shape[0]], q_proj)
    assert LeanDecoder.of(tiny_causal_lm("gpt2")) is None  # an architecture it does not reproduce


@pytest.mark.parametrize("targets", [("q_proj", "lm_head")])
def test_merge_lora_and_rollout_weights_mode_refuse_what_cannot_merge(
    targets: tuple[str, ...],
) -> None:
    import art
    from art.core.data.errors import ConfigError
    from art.runtime.engines.start import check_supported

    config = art.dev.InternalModelConfig(
        engine_args=art.dev.EngineArgs(merge_lora=True),
        peft_args=art.dev.PeftArgs(target_modules=targets),
    )
    with pytest.raises(ConfigError, match="merge_lora"):
        check_supported(config, "transformers")
    with pytest.raises(ConfigError, match="merge_lora"):
        check_supported(
            art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(merge_lora=False)), "vllm"
        )
    # ART's name for the same choice: refused where merge_lora is, and never against it.
    merged = art.dev.InternalModelConfig(
        rollout_weights_mode="merged", peft_args=art.dev.PeftArgs(target_modules=targets)
    )
    for engine in ("transformers", "vllm"):
        with pytest.raises(ConfigError) as raised:
            check_supported(merged, engine)  # type: ignore[arg-type]
        assert raised.value.field == "_internal_config.rollout_weights_mode"
    check_supported(art.dev.InternalModelConfig(rollout_weights_mode="lora"), "transformers")
    opposite = art.dev.InternalModelConfig(
        rollout_weights_mode="lora", engine_args=art.dev.EngineArgs(merge_lora=True)
    )
    with pytest.raises(ConfigError, match="say the opposite"):
        check_supported(opposite, "transformers")


def test_the_prefix_cache_is_bounded_by_entries_and_by_bytes() -> None:
    """Least recently used entries go first past `capacity` entries or `max_bytes`; a
    prefix larger than `max_bytes` alone is not kept; clearing frees every byte."""

    def layers(tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4))] * 3  # 192 B/token

    cache = PrefixCache(min_tokens=1, capacity=3, max_bytes=192 * 100)
    for start in range(4):  # four 20-token prefixes: the capacity of 3 drops the first
        cache.put(None, tuple(range(start, start + 20)), layers(20))
    assert cache.longest(None, tuple(range(0, 20))) is None
    assert cache.bytes == 3 * 192 * 20
    cache.put(None, tuple(range(100, 160)), layers(60))  # 60 more tokens: over 100 in all
    assert cache.bytes <= 192 * 100
    assert cache.longest(None, tuple(range(100, 160))) is not None  # the newest stays
    assert cache.longest(None, tuple(range(1, 21))) is None  # the oldest went first
    cache.put(None, tuple(range(200, 301)), layers(101))  # alone over max_bytes: not kept
    assert cache.longest(None, tuple(range(200, 301))) is None
    cache.clear()
    assert cache.bytes == 0


def test_prefixes_a_few_tokens_apart_are_prefilled_from_their_common_prefix() -> None:
    """One prefill call per distinct prefix costs more than a few tokens per prompt: prefixes
    within `min_tokens` of their longest common prefix are prefilled from it; a prefix that
    extends it further, or a common prefix shorter than `min_tokens`, is kept."""
    cache = PrefixCache(min_tokens=16)
    opening = tuple(range(24))
    write, describe = (*opening, 100, 101, 102), (*opening, 200)
    conversation = (*opening, *range(300, 340))  # 40 tokens past the opening
    coarse = cache.coarsened([write, describe, conversation, ()])
    assert coarse == {write: opening, describe: opening, conversation: conversation}
    short = tuple(range(10))
    apart = cache.coarsened([(*short, *range(50, 70)), (*short, *range(80, 100))])
    assert all(prefix == target for prefix, target in apart.items())  # common < min_tokens
