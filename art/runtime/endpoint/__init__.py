"""The model endpoint: requests in any of four protocols, samples out with their token ids.

- `server.py`: the HTTP app, its auth and error answers, `/v1/chat/completions`, `/v1/models`
  and its `Router` seam; `completions.py`, `responses.py`, `messages.py`: the other protocols.
- `jobs.py`: what every protocol shares: rendering, tool policy, grammar, running the engine.
- `request.py`: what a chat completion request may hold, and how a bad one is answered.
- `response.py`: completions, whole or streamed, each choice with its token ids and logprobs.

It renders (with `..chat_format`, which the trainer renders with too) and tokenizes; an engine (`..engines`) samples token ids.
"""
