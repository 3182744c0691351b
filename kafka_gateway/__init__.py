"""The Kafka face: Kafka's wire protocol over the broker's services. `listener` is the socket
layer; `protocol` (with `apis`, the handlers, `messages`, `records`, `errors`, `session`) is
Kafka's protocol, which never touches a socket."""
