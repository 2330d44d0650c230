"""Inference engines: token ids and sampling settings in, sampled ids and logprobs out.

- `base.py`: the `Engine` protocol, everything the model service and the Ray replica
  may call, the values it takes and returns, and `EngineSpec`, what one needs to start.
- `structured.py`: grammars (JSON schemas, tool calls) that constrain sampling.
- `token_text.py`: a sampled sequence's text as its tokens arrive (stop strings, streams).
- `config_support.py`: what every engine (with the trainer) honours of an
  `InternalModelConfig`, refused by field name otherwise; each engine checks its own
  fields in its `config.py`.
- `transformers/`: our continuous-batching decode loop on any torch device.
- `vllm/`: vLLM's server in a child process from its own environment.
- `fake.py`: `FakeEngine`, scripted samples and no model, for testing what sits above
  the protocol (the endpoint, routing).

`start.py` is the one place that names an engine kind: it picks one for a config and
starts it. Nothing else asks which engine it has. The engines take `EngineSpec` from
`base.py`, never `start.py`: picking an engine and being one do not import each other.
"""
