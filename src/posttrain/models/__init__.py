"""Model loading helpers: offline model aliases (`posttrain.models.hub`), log-probs and optimizers."""
