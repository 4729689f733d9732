"""What every endpoint shares: request models, errors, plain and streamed HTTP responses, the
serving context, metrics, request ids, logprobs and structured outputs. Imports no endpoint."""
