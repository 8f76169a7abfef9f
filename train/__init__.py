"""retr.train: turning a BERT backbone into retr models (bi-encoder, cross-encoder, MLM)."""
