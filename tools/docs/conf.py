# Sphinx configuration of the docs site (tools/docs.sh, `make docs`).
# antsibull-docs writes the reStructuredText (the plugins' and the role's
# docs, and docs/docsite/rst/); this turns it into HTML. No intersphinx: the
# build is offline, and a reference that cannot resolve here is an error
# (nitpicky, with sphinx-build -W), not a link to another site.
import re

project = 'batchq.consumers'
copyright = 'batchq.consumers contributors'
title = 'batchq.consumers'
html_short_title = 'batchq.consumers'

extensions = ['sphinx_antsibull_ext']

pygments_style = 'ansible'
highlight_language = 'YAML+Jinja'

html_theme = 'sphinx_ansible_theme'
html_show_sphinx = False
# Quotes and ellipses only: dashes stay as written, so an option such as
# --max-seconds keeps its two hyphens instead of becoming an en dash.
smartquotes_action = 'qe'
html_use_modindex = False
html_use_index = False
html_copy_source = False
html_theme_options = {
    'display_version': False,
    # The theme's default top bar links to Ansible's blog, forum and docs:
    # not this collection's pages, so none.
    'topbar_links': {},
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
SECTION_ORDER = ['Description', 'Guides', 'Role Index', 'Playbooks', 'Plugin Index', 'Changelog', 'Internal plugins']
CAPTIONS = {'Role Index': 'Role', 'Filter Plugins': 'Filters'}

# A plugin whose short description starts so is the role's and the playbooks'
# own, not a public API (tests/unit/test_plugin_docs.py holds the list of the
# public ones). The index lists it in a section of its own, after the public
# reference.
INTERNAL_MARK = ' -- Internal: '
INTERNAL_TITLE = 'Internal plugins'
INTERNAL_TEXT = ('Used by the role and the playbooks, not a public API: they may change or go in any release without notice.'
                 ' Call the role, the playbooks, the :ansplugin:`consumer_info module <batchq.consumers.consumer_info#module>`'
                 ' and the status filters above instead.')
INTERNAL_KINDS = {'Modules': 'Internal modules', 'Filter Plugins': 'Internal filters'}
# antsibull-docs titles the index and the changelog with the collection's name
# in title case (Batchq.Consumers); the collection's name is lower case.
TITLE_CASED = 'Batchq.Consumers'
NAME = 'batchq.consumers'


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


def _page(bullet):
    """The page name of an index bullet: consumer_info_module for batchq.consumers.consumer_info#module."""
    target = bullet.split('<', 1)[1].split('>', 1)[0]
    name, kind = target.rsplit('#', 1)
    return '%s_%s' % (name.rsplit('.', 1)[1], kind)


def _heading(text, underline):
    return [text, underline * len(text), '']


def internal_apart(text):
    """The index with the internal plugins moved out of the plugin index into a section of their own."""
    lines = text.split('\n')
    internal = {}  # kind heading: [bullets]
    pages = set()
    kind = None
    kept = []
    for i, line in enumerate(lines):
        if _is_heading(lines, i, '~'):
            kind = line
        if line.startswith('* :ansplugin:') and INTERNAL_MARK in line:
            internal.setdefault(kind, []).append(line)
            pages.add(_page(line))
            continue
        kept.append(line)
    if not internal:
        return text
    # Their pages leave the public toctrees, and a section left without a
    # plugin goes (its heading, label and toctree).
    kept = [line for line in kept if line.strip() not in pages or not line.startswith('    ')]
    section = ['', '.. _internal_plugins_in_batchq.consumers:', ''] + _heading(INTERNAL_TITLE, '-') + [INTERNAL_TEXT, '']
    for kind, bullets in internal.items():
        title = INTERNAL_KINDS.get(kind, 'Internal ' + (kind or 'plugins').lower())
        section += _heading(title, '~') + bullets + ['', '.. toctree::', '    :maxdepth: 1', '    :hidden:', '']
        section += ['    ' + _page(bullet) for bullet in bullets] + ['']
    unknown = pages - {_page(bullet) for bullets in internal.values() for bullet in bullets}
    assert not unknown, unknown
    text = '\n'.join(kept).rstrip('\n') + '\n' + '\n'.join(section)
    return text.replace('These are the plugins in the batchq.consumers collection:',
                        'These are the plugins of the batchq.consumers collection that you call:')


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


def short_entries(text):
    """The reference's toctree entries titled by name and kind (consumer_info module), not by the whole
    page title with its description, which the sidebar wrapped into four lines or cut off."""
    return re.sub(r'^    ([a-z0-9_]+)_(module|filter|role)$', r'    \1 \2 <\1_\2>', text, flags=re.M)


def _lower_case_name(text):
    lines = text.split('\n')
    for i, line in enumerate(lines):
        if line.startswith(TITLE_CASED) and i + 1 < len(lines) and set(lines[i + 1]) <= set('=-*'):
            lines[i] = NAME + line[len(TITLE_CASED):]
    return '\n'.join(lines)


def _index_source(app, docname, source):
    if docname == 'index':
        source[0] = index_in_sections(short_entries(internal_apart(_lower_case_name(source[0]))))
    elif docname == 'changelog':
        source[0] = _lower_case_name(source[0])


def setup(app):
    app.connect('source-read', _index_source)
