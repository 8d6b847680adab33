"""Transport security, bearer tokens and the operator-RPC policy, as the server applies them:
``tls`` (certificates, reloaded), ``tokens`` (keys, constant-time checks), ``policy`` (which RPCs
are operator actions and who may call them), ``interceptor`` (the grpc.aio server interceptor),
``config`` (flags and plugin variables), ``serving`` (all of it put on one server), ``channel``
(the client side: TLS, mTLS and a token on a channel)."""
