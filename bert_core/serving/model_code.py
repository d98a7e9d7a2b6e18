"""The registered models' MLflow "models from code" file: MLflow copies it into the MLflow Model and runs it
on load (no pickle). ``bert_core`` comes from the model's own ``code/`` directory (:mod:`bert_core.serving.bundle`), put on
``sys.path`` by MLflow before this file runs, so the model loads where only its declared requirements are
installed. Not imported by the project: :func:`bert_core.serving.pyfunc.save_model` names it by path.
"""

from mlflow.models import set_model

from bert_core.serving.pyfunc import BertPyfunc

set_model(BertPyfunc())
