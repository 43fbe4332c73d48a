"""A third-party library's attention functions, checked by gramcheck in its own CI."""
