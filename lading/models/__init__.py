"""Pydantic models: extraction schemas (what the ERP receives) and resource specs (what users apply)."""
