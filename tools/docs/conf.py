# Sphinx configuration of the docs site (tools/docs.sh, `make docs`).
# antsibull-docs writes the reStructuredText (the plugins' and the role's
# docs, and docs/docsite/rst/); this turns it into HTML. No intersphinx: the
# build is offline, and a reference that cannot resolve here is an error
# (nitpicky, with sphinx-build -W), not a link to another site.
project = 'batchq.consumers'
copyright = 'batchq.consumers contributors'
title = 'batchq.consumers'
html_short_title = 'batchq.consumers'

extensions = ['sphinx_antsibull_ext']

pygments_style = 'ansible'
highlight_language = 'YAML+Jinja'

html_theme = 'sphinx_ansible_theme'
html_show_sphinx = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False
html_theme_options = {
    'display_version': False,
}

default_role = 'any'
nitpicky = True
