"""Inference service: the model, tokenizer and chat template; token-faithful generation with logprobs."""
