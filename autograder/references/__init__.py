"""Reference answers of graded exercises, kept with the grader: the package students get
(``shared/distopt``) holds none of them (issue 53, item 9). One module per section."""
