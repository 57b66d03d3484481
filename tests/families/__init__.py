"""Task families added the way a user adds one: a module each, named in the profile."""
