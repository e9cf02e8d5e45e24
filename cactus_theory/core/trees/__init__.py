"""Trees and multi-draft verification, exact (numpy, float64; array API where declared).

``base``: one node (``Node``), how its children are drafted (``proposals``), the contract
of a tree rule (``TreeRule``: ``sibling_accepts``, ``final_residual``) and the decisions a
uniform makes at a node (``decide``).
"""
