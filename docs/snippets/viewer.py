"""`art show`'s page, from Python: one static HTML file of a project's runs."""

import art.viewer

if __name__ == "__main__":
    page = art.viewer.write_page("./.art", project="my-task")
    print(page)
