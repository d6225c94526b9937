"""Cleaning the store: `gc` (old artifacts, unreferenced chunks) under its lock, and the sweep of
what killed processes left (staging files, multipart uploads, scratch)."""
