"""Security: identities (TLS client certificates, bearer tokens), the access policy of
every RPC, abuse limits, and the PKI helper. See docs/security.md."""
