"""Report every history.jsonl row of a model to W&B (ART's `report_metrics` switch)."""

import art

model = art.TrainableModel(
    name="agent-001",
    project="my-task",
    base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    report_metrics=["wandb"],
)
