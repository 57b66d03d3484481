"""The served agent's model code (MLflow "models from code"): what `mlflow.pyfunc.load_model` and
`mlflow models serve` run to build the agent; assets/agent_model.py logs this file with the model."""

import mlflow

from training.agent.served import ToolAgent

mlflow.models.set_model(ToolAgent())
