"""Summaries of conversation turns: a local extractive summarizer and the facts it keeps."""
