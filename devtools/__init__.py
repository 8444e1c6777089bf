"""Developer tooling: the local demo, the local services it starts (moto S3, a Ray head on
loopback) and the offline tokenizer builder. Not part of the operator CLI; may import every
other package of the repository."""
