def choose_tree(*args):
    raise NotImplementedError
