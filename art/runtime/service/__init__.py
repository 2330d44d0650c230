"""The model service: which models are loaded, what each name serves, and training.

- `model_service.py`: `ModelService`, the facade `LocalBackend`, its child process and
  `art serve` call. The lock order is written there.
- `registry.py`: loaded base models and the trainable models on them.
- `checkpoints.py`: checkpoints loaded into an engine, leased while a request uses one.
- `training.py`: the training driver: a step, its checkpoint saved, then served.
- `placement.py`: where engines and trainers run (this process, or a Ray cluster).
"""
