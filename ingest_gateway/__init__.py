"""The HTTP face: its app (`app.create_app`, built by the composition root topiclake.gateway), the
kit every HTTP router shares (`kit`: the status table, errors, parameters, dependencies,
forwarding), the body decoders, and the routers for produce, topics, the schema registry,
operations and jobs. The consume routers are consumer_api's, the console's are console's; all of
them call the broker's services (broker) and encode what they answer."""
