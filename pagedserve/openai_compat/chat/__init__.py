"""/v1/chat/completions: serving, tools and tool-call parsers, reasoning, one choice's output."""
