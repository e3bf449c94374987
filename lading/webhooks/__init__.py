"""The webhook contract between Lading's delivery dispatcher and an ERP receiver.

`signing` implements the Standard Webhooks signature scheme (both directions); `payload` is the
versioned JSON body. Both sides import these, so the contract has one definition.
"""
