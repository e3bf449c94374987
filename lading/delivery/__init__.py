"""
Delivery of results to ERP webhooks: the delivery state machine, the dispatcher that claims
due deliveries and POSTs them signed, and the egress policy that decides which addresses it
may connect to. The body and signatures are the public contract in `lading.webhooks`.
"""
