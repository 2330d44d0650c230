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
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]


def output_head(causal_lm: torch.nn.Module) -> Head:
    """The model's logits from hidden states, with its own logit scaling, if any."""
    linear = causal_lm.get_output_embeddings()  # type: ignore[operator]
    config = causal_lm.config
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 and 3
    scale = getattr(causal_lm, "logit_scale", None)  # Cohere multiplies
    divide = getattr(config, "logits_scaling", None)  # Granite divides

    def head(hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = linear(hidden)
        if isinstance(scale, float):
            logits = logits * scale
        if isinstance(divide, float | int) and divide != 1:
            logits = logits / divide
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    return head


class _TokenLogprobs(torch.autograd.Function):
    """Logits [rows, vocabulary] to each target's logprob and each row's entropy (no
    gradient), with one vocabulary-wide tensor made in forward and none in backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        peak = logits.amax(dim=-1, keepdim=True)
        probs = torch.sub(logits, peak).exp_()
        totals = probs.sum(dim=-1, keepdim=True)
        log_totals = totals.log()
        probs.div_(totals)
        # The peak taken out before the rest: the difference of two large logits is exact.
        logprobs = ((logits.gather(-1, targets[:, None]) - peak) - log_totals).squeeze(-1)
        # sum(p * logits) row by row as a batched dot product: no third wide tensor.
        expected = torch.bmm(probs[:, None, :], logits[:, :, None]).view(-1)
        entropy = (peak + log_totals).squeeze(-1) - expected
        ctx.save_for_backward(probs, targets)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor, _entropy: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        probs, targets = ctx.saved_tensors  # type: ignore[attr-defined]
        # d logprob_i / d logits_ij = [j == target_i] - p_ij; the probabilities are not
        # needed again, so they become the gradient (a second backward is refused by
        # autograd's version check, not answered wrongly).
        logits_grad = probs.mul_(-grad[:, None])
        logits_grad.scatter_add_(-1, targets[:, None], grad[:, None])
        return logits_grad, None


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


__all__ = ["Head", "output_head", "sampled_logprobs"]
