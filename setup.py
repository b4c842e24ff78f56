"""Metadata lives in setup.cfg. This file only adds the ``TRL_COMPAT_AUTO`` start-up files
(``trl_compat.pth``, ``trl_compat.start`` and the module they call, ``_trl_compat_auto.py``)
to the wheel's root, i.e. to site-packages, where ``site`` reads them at interpreter start.
setuptools has no declarative way to put a file there."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

SITE_FILES_DIR = os.path.join("trl_compat", "activation", "site_files")
SITE_FILES = ("trl_compat.pth", "trl_compat.start", "_trl_compat_auto.py")


class build_py_with_site_files(build_py):
    def run(self):
        super().run()
        for name in SITE_FILES:
            self.copy_file(os.path.join(SITE_FILES_DIR, name), os.path.join(self.build_lib, name), preserve_mode=False)

    def get_outputs(self, *args, **kwargs):
        return list(super().get_outputs(*args, **kwargs)) + [os.path.join(self.build_lib, n) for n in SITE_FILES]

    def get_source_files(self):  # what sdist ships
        return list(super().get_source_files()) + [os.path.join(SITE_FILES_DIR, n) for n in SITE_FILES]


class sdist_with_symlinked_tests(sdist):
    """setuptools lists a file reachable through a symlinked directory once, under whichever
    path it walks first: tests/vllm_standin/v0.9.1/vllm (a symlink) can hide tests/vllm_standin/vllm.
    Put the real paths back; the symlinked copies stay (the versioned stand-ins need them)."""

    def make_distribution(self):
        listed = set(self.filelist.files)
        for dirpath, dirnames, filenames in os.walk("tests"):  # symlinks not followed: the real files
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                path = os.path.join(dirpath, name)
                if not name.endswith((".pyc", ".pyo")) and path not in listed:
                    self.filelist.append(path)
        super().make_distribution()


setup(cmdclass={"build_py": build_py_with_site_files, "sdist": sdist_with_symlinked_tests})
