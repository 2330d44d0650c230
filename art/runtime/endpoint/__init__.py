"""The OpenAI-compatible endpoint: requests in, chat completions out.

- `server.py`: the HTTP app (`/v1/chat/completions`, `/v1/models`) and its `Router` seam.
- `request.py`: what a chat completion request may hold, and how a bad one is answered.
- `response.py`: completions, whole or streamed, each choice with its token ids and logprobs.

It renders (with `..chat_format`, which the trainer renders with too) and tokenizes; an engine (`..engines`) samples token ids.
"""
