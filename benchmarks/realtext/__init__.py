"""The real-text benchmark (`python -m benchmarks.realtext.bench`): sources.py (the files it reads,
with their hashes), troff.py (man pages as `man` prints them), chats.py (chats and agent loops made
of them), facts.py (its own definition of a fact) and bench.py (the measurements)."""
