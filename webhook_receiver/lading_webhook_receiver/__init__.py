"""
The reference ERP-side webhook receiver: verifies Standard Webhooks signatures, records
each delivery durably by `delivery_id` before answering 2xx, and applies the ERP effect
once however often a delivery is retried.
"""
