"""bert_core: the library behind the BERT pipeline (model, tokenizer, data, training, metrics).

Plain Python + PyTorch. It never imports the orchestrators (Prefect, DVC); every stage's logic is a typed
function that a test can call directly.
"""

__version__ = "0.1.0"
