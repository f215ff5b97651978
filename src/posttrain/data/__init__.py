"""Datasets, chat templates, tokenisation with loss masks, collation and sampling."""
