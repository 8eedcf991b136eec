"""Certification: the golden required-test list, the vendor's PRODUCT.yaml, a verifiable bundle and its verifier."""
