"""Who a client is: listeners and their security protocols, TLS, SASL (PLAIN, SCRAM)."""
