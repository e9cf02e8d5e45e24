class TreeBudget:
    pass
