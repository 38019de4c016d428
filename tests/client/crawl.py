"""One real Scrapy crawl through :class:`proxy_operator_client.scrapy.ProxyLeaseMiddleware`,
run by the tests in a subprocess (Twisted's reactor runs once per process)::

    PROXY_OPERATOR_TOKEN=... python -m tests.client.crawl CONFIG.json

CONFIG: ``{"base": site URL, "bases": [more site URLs: page i goes to site i % len], "pages": n,
"sessions": k (0: no proxy_session), "close_after": m (0: never), "api": API URL, "log": log
file, "stats": where to write the stats as JSON, "settings": {extra Scrapy settings}}``.  The
token comes from the environment (the middleware's fallback), so it is in no file.
"""

from __future__ import annotations

import json
import sys

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import CloseSpider


def captcha(request, response) -> bool:
    """The ban detector of the crawl: the site's captcha page."""
    return b"captcha" in response.body


class PagesSpider(scrapy.Spider):
    """Fetches ``pages`` pages of the site (of the sites ``bases``, in turn); with ``sessions``,
    page i belongs to session ``i % sessions`` (``proxy_session`` meta); raises CloseSpider
    after ``close_after`` pages.  A captcha page that reaches it (the ban retries used up) is
    counted as ``test/captchas``, not as a page."""

    name = "pages"

    def __init__(self, base: str, pages: int, sessions: int = 0, close_after: int = 0, bases=None, **kw) -> None:
        super().__init__(**kw)
        self.bases = list(bases or [base])
        self.pages, self.sessions, self.close_after = pages, sessions, close_after
        self.done = 0

    async def start(self):
        for i in range(self.pages):
            base = self.bases[i % len(self.bases)]
            if self.sessions:
                s = i % self.sessions
                yield scrapy.Request(f"{base}/s/{s}/{i}", meta={"proxy_session": f"session-{s}"})
            else:
                yield scrapy.Request(f"{base}/page/{i}")

    def parse(self, response):
        if b"captcha" in response.body:
            self.crawler.stats.inc_value("test/captchas")
            return
        self.crawler.stats.inc_value("test/pages")
        self.done += 1
        if self.close_after and self.done >= self.close_after:
            raise CloseSpider("enough")


def main(path: str) -> None:
    with open(path) as fh:
        config = json.load(fh)
    settings = {
        "DOWNLOADER_MIDDLEWARES": {"proxy_operator_client.scrapy.ProxyLeaseMiddleware": 580},
        "PROXY_OPERATOR_URL": config["api"],
        "PROXY_OPERATOR_BAN_DETECTOR": "tests.client.crawl.captcha",
        "PROXY_OPERATOR_WAIT": 5,
        "LOG_LEVEL": "DEBUG",
        "LOG_FILE": config["log"],
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "DOWNLOAD_TIMEOUT": 10,
        **config.get("settings", {}),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(PagesSpider)
    process.crawl(crawler, base=config["base"], pages=config["pages"], sessions=config.get("sessions", 0),
                  close_after=config.get("close_after", 0), bases=config.get("bases"))
    process.start()
    with open(config["stats"], "w") as fh:
        json.dump(crawler.stats.get_stats(), fh, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
