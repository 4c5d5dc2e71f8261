"""``RateLimit``'s settings: kept so that ``from ratelimit.settings import ...`` goes on
working; the module is :mod:`ratelimit.core.settings` (their checks:
:mod:`ratelimit.core.checks`)."""

from ratelimit.core.settings import ENGINE_SETTINGS as ENGINE_SETTINGS
from ratelimit.core.settings import Settings as Settings
from ratelimit.core.settings import SettingsKeywords as SettingsKeywords
from ratelimit.core.settings import settings_with as settings_with
