"""/v1/messages and /v1/messages/count_tokens (Anthropic's Messages API), served on the chat
machinery: its request model, the conversion to a chat request, the blocks and stream events,
the error envelope, serving."""
