"""The transformers engine: our continuous-batching decode loop (the CPU default).

- `engine.py`: `TransformersEngine`, the engine protocol over the scheduler.
- `scheduler.py`: which requests run, when they join the batch, and the decode jobs.
- `decode.py`: prefill and decode steps over a batch of rows; stops and grammars per row.
- `sampling.py`, `kv_cache.py`, `prefix_cache.py`: sampling, the KV cache, cached prefixes.
- `merged.py`, `lean_decode.py`, `decode_attention.py`: the fast paths on the CPU.
"""
