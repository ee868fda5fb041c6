"""The CP's data layer: one repository module per resource; every SQL statement of the CP lives here.

Routers check, call a store function and answer. Store functions take the `Database` and own their
transaction; the publication module holds the lock order and the generation bump they share.
"""
