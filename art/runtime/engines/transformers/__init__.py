"""The transformers engine: our continuous-batching decode loop (the CPU default).

- `engine.py`: `TransformersEngine`: the protocol, its model lock, adapters, and the
  scheduler (which requests run, when they join the batch, the decode jobs).
- `batch.py`: prefill (shared prompts and cached prefixes) and decode steps of a batch.
- `rows.py`: requests and their rows: stop tokens and strings, grammars, answers.
- `sampling.py`, `kv_cache.py`, `prefix_cache.py`: sampling, the KV cache, cached prefixes.
- `merged.py`, `lean_decode.py`: the fast paths on the CPU (with `art/runtime/decode_attention.py`,
  which `models.load` installs on every CPU base model).
"""
