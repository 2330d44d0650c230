"""Log-probabilities of sampled tokens through the LM head, in chunks.

The full [tokens x vocabulary] logits of a long step are the largest tensors a training
step would make (8 x 2k tokens x 49k vocabulary x 4 bytes = 3.2 GB, kept for backward).
Here the head runs on `chunk_rows` hidden states at a time, each chunk under
`torch.utils.checkpoint`: forward keeps only the chunk's hidden states and its
logprobs, and backward recomputes one chunk's logits at a time. So at most one chunk of
logits is alive, in forward and in backward. Rows that fit in one chunk are not
checkpointed: what they keep from forward to backward (the probabilities, below) takes no
more memory than the recompute would (the head's backward comes first, every activation
still alive), and the head's forward is not run twice.

Why checkpoint and not a fused kernel: Liger Kernel's and Unsloth's fused linear
cross-entropy are Triton kernels (CUDA only), and a hand-written autograd Function
would have to know the head's parameters, which a LoRA on `lm_head` changes; checkpoint
differentiates whatever the head module is, on any device.

After the head, one autograd Function (`_TokenLogprobs`) takes the logits to the
logprobs and entropies: it keeps one vocabulary-wide tensor (the probabilities) for
backward and turns it into the logits' gradient in place. Autograd's own ops
(logsumexp, gather, softmax) made about eight such tensors a chunk, each of tens of
megabytes: every one a fresh mapping to fault in on a CPU, where a training step
returns blocks of 4 MiB or more to the system (`memory.large_frees_returned`).

Inside `OutputHead.reusing_logits` (a training step), where the head is one frozen
float32 linear layer (the tied embedding of most models) and the rows fit in one chunk, a
third Function (`_LinearTokenLogprobs`) writes the logits into one buffer kept for the
step, turns them into the probabilities there and takes the hidden states' gradient from
them: no vocabulary-wide tensor is made per micro-batch at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]

# Rows of logits turned into probabilities at a time: their exponentials (a temporary)
# stay under glibc's 4 MiB mmap threshold of a training step, so they come from the heap.
_EXP_BLOCK_BYTES = 2 * 1024 * 1024


class OutputHead:
    """The model's logits from hidden states, with its own logit scaling, if any (a `Head`).

    `reusing_logits()` lets a step keep one logits buffer for all its micro-batches
    (`linear_workspace`).
    """

    def __init__(self, causal_lm: torch.nn.Module) -> None:
        self.linear = causal_lm.get_output_embeddings()  # type: ignore[operator]
        config = causal_lm.config
        self.softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 and 3
        scale = getattr(causal_lm, "logit_scale", None)  # Cohere multiplies
        self.scale = scale if isinstance(scale, float) else None
        divide = getattr(config, "logits_scaling", None)  # Granite divides
        self.divide = divide if isinstance(divide, float | int) and divide != 1 else None
        self._reusing = False
        self._buffer: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.linear(hidden)
        if self.scale is not None:
            logits = logits * self.scale
        if self.divide is not None:
            logits = logits / self.divide
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @contextlib.contextmanager
    def reusing_logits(self) -> Iterator[None]:
        """Within (one training step): `linear_workspace` gives one buffer, kept until the
        scope ends, for every micro-batch's logits."""
        self._reusing = True
        try:
            yield
        finally:
            self._reusing = False
            self._buffer = None

    def linear_workspace(
        self, hidden: torch.Tensor, capacity: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the head's weight, a [rows, vocabulary] view of the kept buffer) where this
        head is one frozen float32 linear layer with nothing after it, inside
        `reusing_logits`, with gradients on and no autocast; None elsewhere. The buffer
        holds `capacity` rows (a chunk's), of which only those written are ever touched."""
        linear = self.linear
        plain = type(linear) is torch.nn.Linear and linear.bias is None
        if not (self._reusing and plain and torch.is_grad_enabled()):
            return None
        if self.scale is not None or self.divide is not None or self.softcap:
            return None
        weight: torch.Tensor = linear.weight
        if weight.requires_grad or torch.is_autocast_enabled(hidden.device.type):
            return None
        if hidden.dtype != torch.float32 or weight.dtype != torch.float32:
            return None
        rows = hidden.shape[0]
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < rows or buffer.device != hidden.device:
            buffer = hidden.new_empty(max(rows, capacity), weight.shape[0])
            self._buffer = buffer
        return weight, buffer[:rows]


def output_head(causal_lm: torch.nn.Module) -> OutputHead:
    """The model's logits from hidden states, with its own logit scaling, if any."""
    return OutputHead(causal_lm)


def _into_probabilities(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn float32 `logits` [rows, vocabulary] into their softmax in place; each target's
    logprob and each row's entropy.

    The row's peak comes out first: the difference of two large logits is exact, and the
    entropy is log(total) - sum(p * (logit - peak)), with no cancellation of large sums
    (sum(p * logit) less the normalizer was off by up to 4e-3 on the default model). The
    exponentials are taken a block of rows at a time into one buffer kept for the call
    (under glibc's mmap threshold), so the only vocabulary-wide tensor is `logits`."""
    peak = logits.amax(dim=-1, keepdim=True)
    picked = logits.gather(-1, targets[:, None])
    totals = torch.empty_like(peak)
    expected = torch.empty_like(peak)  # sum(exp(logit - peak) * (logit - peak))
    rows = max(1, _EXP_BLOCK_BYTES // (logits.shape[1] * logits.element_size()))
    exps = logits.new_empty(min(rows, logits.shape[0]), logits.shape[1])
    for start in range(0, logits.shape[0], rows):
        block = logits[start : start + rows].sub_(peak[start : start + rows])
        block_exps = torch.exp(block, out=exps[: block.shape[0]])
        totals[start : start + rows, 0] = block_exps.sum(dim=-1)
        # vecdot, not bmm of [rows, 1, V] x [rows, V, 1]: torch's CPU bmm takes that
        # shape ~30x slower (2.9 ms against 93 us at 10 x 49,152; Intel Xeon, AVX2
        # kernels, 2026-12-01). This and the kept buffer together: the GRPO benchmark's
        # `PeftTrainer.step` 7.15 -> 6.73 s.
        expected[start : start + rows, 0] = torch.linalg.vecdot(block_exps, block)
        block.copy_(block_exps)
    log_totals = totals.log()
    logits.div_(totals)
    logprobs = ((picked - peak) - log_totals).squeeze(-1)
    entropy = (log_totals - expected / totals).squeeze(-1)
    return logprobs, entropy


def _into_logits_gradient(
    probs: torch.Tensor, targets: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """The logits' gradient from the logprobs' `grad`, made in place of `probs`.

    d logprob_i / d logits_ij = [j == target_i] - p_ij; the probabilities are not needed
    again, so they become the gradient (a second backward is refused by autograd's version
    check, not answered wrongly)."""
    logits_grad = probs.mul_(-grad[:, None])
    return logits_grad.scatter_add_(-1, targets[:, None], grad[:, None])


class _TokenLogprobs(torch.autograd.Function):
    """Logits [rows, vocabulary] to each target's logprob and each row's entropy (no
    gradient), with one vocabulary-wide tensor made in forward and none in backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probs = logits.clone()
        logprobs, entropy = _into_probabilities(probs, targets)
        ctx.save_for_backward(probs, targets)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor, _entropy: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        probs, targets = ctx.saved_tensors  # type: ignore[attr-defined]
        return _into_logits_gradient(probs, targets, grad), None


class _LinearTokenLogprobs(torch.autograd.Function):
    """`_TokenLogprobs` of `hidden` times a frozen head `weight` ([vocabulary, width]), the
    logits written into `logits` (a kept buffer) and turned into the probabilities there;
    backward gives `hidden`'s gradient only."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        logits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        torch.mm(hidden, weight.t(), out=logits)
        logprobs, entropy = _into_probabilities(logits, targets)
        ctx.save_for_backward(logits, targets, weight)  # the probabilities now
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor, _entropy: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        probs, targets, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        # A later micro-batch writing the buffer before this backward ran fails autograd's
        # version check above, never gives a wrong gradient.
        logits_grad = _into_logits_gradient(probs, targets, grad)
        return torch.mm(logits_grad, weight), None, None, None


def _chunk(
    hidden: torch.Tensor, targets: torch.Tensor, head: Head
) -> tuple[torch.Tensor, torch.Tensor]:
    # torch types Function.apply untyped.
    logprobs, entropy = _TokenLogprobs.apply(head(hidden).float(), targets)  # type: ignore[no-untyped-call]
    return logprobs, entropy


def sampled_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: Head, chunk_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-probability of each target and the entropy (no grad) at each row.

    `hidden` is [rows, hidden size]: the hidden state that predicts each `targets` token.
    """
    logprobs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    # Only several chunks are checkpointed: one is no larger kept than recomputed (above).
    recompute = torch.is_grad_enabled() and hidden.shape[0] > chunk_rows
    workspace = (
        head.linear_workspace(hidden, chunk_rows)
        if isinstance(head, OutputHead) and not recompute
        else None
    )
    if workspace is not None:
        weight, logits = workspace
        # torch types Function.apply untyped.
        logprob, entropy = _LinearTokenLogprobs.apply(hidden, weight, targets, logits)  # type: ignore[no-untyped-call]
        return logprob, entropy.detach()
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        if recompute:
            result = checkpoint(_chunk, hidden[rows], targets[rows], head, use_reentrant=False)
            logprob, entropy = result
        else:
            logprob, entropy = _chunk(hidden[rows], targets[rows], head)
        logprobs.append(logprob)
        entropies.append(entropy.detach())
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logprobs), torch.cat(entropies)


__all__ = ["Head", "OutputHead", "output_head", "sampled_logprobs"]
