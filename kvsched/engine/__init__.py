"""The real engine: kvsched's scheduler driving a PyTorch model (``kvsched.LLM``)."""
