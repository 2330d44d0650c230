"""The model endpoint: requests in any of four protocols, samples out with their token ids.

- `server.py`: the HTTP app, its auth and error answers, `/v1/chat/completions`, `/v1/models`
  and its `Router` seam.
- `completions/`, `responses/`, `messages/`: the other protocols, one package each: its
  route in `__init__.py`, what a request may hold in `request.py` (read as a chat request
  in `chat.py`, for Responses and Messages), the whole answer in `answer.py`, the streamed
  one in `stream.py`; and Responses' stored responses in `store.py`.
- `jobs.py`: what every protocol shares: reading the body, finding the route and releasing
  it once, rendering, tool policy, grammar, running the engine.
- `streaming.py`: what the four protocols' streams share: the sampled text as it grows,
  the server-sent-events response.
- `request.py`: what a chat completion request may hold, and how a bad one is answered.
- `response.py`: chat completions, each choice with its token ids and logprobs; streamed
  by `chat_stream.py`.

It renders (with `..chat_format`, which the trainer renders with too) and tokenizes; an engine (`..engines`) samples token ids.
"""
