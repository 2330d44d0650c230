"""The client core, in layers (each folder imports only the ones below it):

- `data/`: the data model (trajectories, exchanges, types, configs, errors); imports
  nothing else of `art`.
- `capture/`: capture scopes, recorded exchanges, SDK and httpx hooks; on `data/`.
- `metrics/`: metric names, batch metrics, the builder, costs; on `data/`.
- `store/`: atomic files, the model's directory, Parquet, S3; on `data/` and `metrics/`.
- this folder's own modules, on top: `Model`/`TrainableModel`, the `Backend` protocol,
  gathering, the one training step.

Imports nothing from `art.runtime`, `art.backends`, `art.ruler`, `art.autorl` or
`art.integrations`.
"""
