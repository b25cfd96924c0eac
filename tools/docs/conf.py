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
# Hides in the page body the toctree captions that setup() below adds.
html_static_path = ['_static']
html_css_files = ['batchq.css']

default_role = 'any'
nitpicky = True


# antsibull-docs writes the index page with the guides and the playbooks
# (docs/docsite/extra-docs.yml), then the modules and filters, then the role,
# each in a toctree without a caption: the sidebar was one flat list with the
# role last. This puts the role's section after the guides and gives every
# toctree its section's title as a caption, so the sidebar has sections.
SECTION_ORDER = ['Description', 'Guides', 'Role Index', 'Playbooks', 'Plugin Index', 'Changelog']
CAPTIONS = {'Role Index': 'Role', 'Filter Plugins': 'Filters'}


def _is_heading(lines, i, underline):
    return (i + 1 < len(lines) and lines[i].strip() and not lines[i].startswith(' ')
            and lines[i + 1] == underline * len(lines[i]))


def _has_entries(lines, i):
    """Whether the toctree directive at lines[i] lists any page."""
    for line in lines[i + 1:]:
        if line.strip() and not line.startswith('    '):
            return False
        if line.strip() and not line.strip().startswith(':'):
            return True
    return False


def index_in_sections(text):
    lines = text.split('\n')
    starts = []
    for i in range(len(lines)):
        if _is_heading(lines, i, '-'):
            start = i
            # the section's labels and blank lines above its title go with it
            while start > 0 and (not lines[start - 1].strip() or lines[start - 1].startswith('.. _')):
                start -= 1
            starts.append((start, lines[i]))
    if not starts:
        return text
    bounds = [start for start, _title in starts] + [len(lines)]
    preamble = lines[:bounds[0]]
    sections = [(title, lines[bounds[n]:bounds[n + 1]]) for n, (_start, title) in enumerate(starts)]
    rank = {title: n for n, title in enumerate(SECTION_ORDER)}
    sections.sort(key=lambda section: rank.get(section[0], len(SECTION_ORDER)))
    out, heading = list(preamble), None
    for _title, body in sections:
        for i, line in enumerate(body):
            if _is_heading(body, i, '-') or _is_heading(body, i, '~'):
                heading = line
            out.append(line)
            if line == '.. toctree::' and heading and _has_entries(body, i):
                out.append('    :caption: ' + CAPTIONS.get(heading, heading))
    return '\n'.join(out)


def _index_source(app, docname, source):
    if docname == 'index':
        source[0] = index_in_sections(source[0])


def setup(app):
    app.connect('source-read', _index_source)
