"""/v1/responses (the Responses API), served on the chat machinery: its request model, items in
and out, the stored responses, serving."""
